"""Matrix products through cuBLAS, on the CUDA driver, with nvmath-python.

The one module that imports nvmath (``pip install -e ".[blas]"``), and
only once a matrix product asks for it: ``import numbagraph`` never does.
``matmul_into`` asks :func:`plan` whether cuBLAS takes its operands' layout
and :func:`gemm_call` for the call; where either says no, its numba kernel
runs.

The rules this module keeps:

* cuBLAS runs where the backend runs libraries' kernels (the driver), the
  setting allows it (``ng.set_matmul_backend``), nvmath imports and
  libcublas loads. An absent extra is never an error unless cuBLAS was asked
  for by name.
* One handle per (thread, device): a cuBLAS handle is not thread-safe.
  Handles are made outside captures (cublasCreate may allocate), and never
  destroyed: the handle of a thread that ended, and one spare per device made
  beside the first, go to a thread that needs one inside a capture.
* Every call is given a workspace that belongs to one user, set after the
  stream (cublasSetStream resets it), so cuBLAS never allocates, inside a
  capture or out, and no two users that may run at once share one: eager
  calls share one per (stream, device), used in that stream's order; a
  capture's graph owns one per stream of the capture, taken from the spares
  made outside captures or, with none left, allocated inside the graph for
  the call and freed after it (graph memory; not in a conditional body).
  Graph replays of one executable never overlap, so its workspace is its
  own; a graph embedded as a child graph, or updated from, shares its
  workspace with the graph it came from.
* float32 computes in float32 (CUBLAS_COMPUTE_32F), or with TF32 tensor
  cores where ``ng.set_tf32(True)`` allows it (CUBLAS_COMPUTE_32F_FAST_TF32);
  float16 and bfloat16 in float32, split-K reductions included (the
  handle's math mode disallows reduced-precision reductions); float64 in
  float64.
"""

from __future__ import annotations

import threading
import warnings
from collections import OrderedDict
from typing import Any, NamedTuple

import numpy as np
from numba import cuda

from .. import _registry
from .._rebind import Fixed
from .._registry import LEGACY_DEFAULT_HANDLES
from .._registry import sessions as _sessions
from ..alloc import free
from ..backend import active as _backend
from ..errors import CaptureWarning, NumbagraphError, OpError
from ..safety import allocation_allowed, graph_allocate, library_work_session
from ._operands import BFLOAT16

__all__ = [
    "INSTALL",
    "CHOICES",
    "settings",
    "unavailable",
    "enabled",
    "Gemm",
    "plan",
    "Call",
    "gemm_call",
    "run",
    "finish",
    "prepare",
]

# numbagraph is not on a package index yet: its extras install from its checkout.
INSTALL = 'pip install -e ".[blas]"'
CHOICES = ("auto", "cublas", "numba")

_INT_MAX = 2**31 - 1
# Workspaces as PyTorch sizes them: 32 MiB from Hopper on, 8 MiB before.
_WORKSPACE_BYTES = {True: 32 * 2**20, False: 8 * 2**20}
# cublasSetWorkspace needs 256-byte alignment.
_ALIGN = 256
# Eager workspaces kept, one per (stream, device), most recently used last.
_MAX_EAGER = 16


class _Settings:
    """What ``ng.set_matmul_backend`` and ``ng.set_tf32`` set, for every
    thread: read as a call is checked, and kept by a graph as captured."""

    choice = "auto"
    tf32 = False


settings = _Settings()


# ---------------------------------------------------------------- the library

# [(nvmath's cublas module or None, why it cannot run or None)], once tried.
_loaded: list[tuple[Any, str | None]] = []
_load_lock = threading.Lock()


def _load() -> tuple[Any, str | None]:
    try:
        from nvmath.bindings import cublas
    except ImportError as exc:
        return None, (f"nvmath-python is not installed ({exc}); `{INSTALL}`, run from "
                      "numbagraph's repository root, installs it")
    except Exception as exc:  # noqa: BLE001  a broken install says why
        return None, f"nvmath-python did not import ({type(exc).__name__}: {exc})"
    try:
        cublas.get_property(0)  # the major version: loads libcublas
    except Exception as exc:  # noqa: BLE001  the loader's own error says what it looked for
        return None, (
            f"nvmath-python could not load libcublas ({type(exc).__name__}: {exc}); "
            "install cuBLAS for the CUDA in use: the CUDA toolkit, or its wheels "
            "(`pip install nvmath-python[cu13]`, or `[cu12]`)")
    return cublas, None


def _cublas() -> Any:
    """nvmath's cuBLAS bindings, loaded (call once :func:`unavailable`
    returned None)."""
    return _loaded[0][0]


def unavailable() -> str | None:
    """Why cuBLAS cannot run here, or None when it can. Imports nvmath and
    loads libcublas the first time it is asked, on the driver only."""
    if not _backend.LIBRARY_KERNELS:
        return ("cuBLAS runs only on the CUDA driver, and numbagraph runs on Numba's "
                "CUDA simulator here")
    if not _loaded:
        with _load_lock:
            if not _loaded:
                _loaded.append(_load())
    return _loaded[0][1]


def enabled() -> bool:
    """Whether matmul_into calls cuBLAS for the layouts it takes."""
    return settings.choice != "numba" and unavailable() is None


def _broken(reason: str) -> None:
    """cuBLAS loaded but does not work (no handle could be made): from now
    on it is unavailable, for that reason."""
    with _load_lock:
        _loaded[:] = [(None, reason)]


class _Enums:
    """nvmath's enumerations, as the ints its calls take."""

    def __init__(self, cublas: Any):
        import nvmath

        types = nvmath.CudaDataType
        compute = cublas.ComputeType
        self.N, self.T = int(cublas.Operation.N), int(cublas.Operation.T)
        self.data = {np.dtype(np.float16): int(types.CUDA_R_16F),
                     np.dtype(np.float32): int(types.CUDA_R_32F),
                     np.dtype(np.float64): int(types.CUDA_R_64F)}
        if BFLOAT16 is not None:
            self.data[BFLOAT16] = int(types.CUDA_R_16BF)
        self.compute_32f = int(compute.COMPUTE_32F)
        self.compute_tf32 = int(compute.COMPUTE_32F_FAST_TF32)
        self.compute_64f = int(compute.COMPUTE_64F)
        self.algo = int(cublas.GemmAlgo.DEFAULT)
        self.math = int(cublas.Math.DEFAULT_MATH) | int(
            cublas.Math.DISALLOW_REDUCED_PRECISION_REDUCTION)


_enums: list[_Enums] = []


def _e() -> _Enums:
    if not _enums:
        _enums.append(_Enums(_cublas()))
    return _enums[0]


# alpha = 1 and beta = 0, in host memory cuBLAS reads as the call is made
# (CUBLAS_POINTER_MODE_HOST, the default): the values go into the kernels'
# parameters, and so into a graph.
_SCALARS: dict[np.dtype, tuple[np.ndarray, np.ndarray]] = {
    np.dtype(t): (np.ones(1, t), np.zeros(1, t)) for t in (np.float32, np.float64)}


# ---------------------------------------------------------------- layouts

class Gemm(NamedTuple):
    """One cuBLAS product for row-major ``out = a @ b`` (each possibly a
    batch). cuBLAS is column-major: a row-major matrix is, to it, its
    transpose. With ``swap``, cuBLAS computes ``out`` transposed,
    ``outᵀ = bᵀ·aᵀ``, its A being ``b`` and its B ``a``; without, ``out``
    as a column-major matrix, ``a·b``. Leading dimensions and batch strides
    are in elements."""

    swap: bool
    transa: bool
    transb: bool
    m: int
    n: int
    k: int
    lda: int
    ldb: int
    ldc: int
    stride_a: int
    stride_b: int
    stride_c: int
    batches: int


def _forms(rows: int, cols: int, s0: int, s1: int) -> tuple[int | None, int | None]:
    """The leading dimension of a (rows, cols) matrix with element strides
    (s0, s1) read as cuBLAS reads memory: as its transpose stored
    column-major (rows contiguous), and as itself stored column-major
    (columns contiguous); None where the layout is not that. A dimension of
    one element has no stride that matters."""
    row = col = None
    if (cols <= 1 or s1 == 1) and (rows <= 1 or s0 >= cols):
        row = s0 if rows > 1 else max(1, cols)
    if (rows <= 1 or s0 == 1) and (cols <= 1 or s1 >= rows):
        col = s1 if cols > 1 else max(1, rows)
    return row, col


def _matrix(shape: tuple, strides: tuple, itemsize: int,
            batches: int) -> tuple[int, int | None, int | None] | None:
    """(batch stride, row-form ld, column-form ld) of one operand, in
    elements; None for strides that are not whole elements or a batch that
    steps backwards."""
    if any(s % itemsize for s in strides):
        return None
    elements = [s // itemsize for s in strides]
    if len(shape) == 3:
        batch, s0, s1 = elements
        rows, cols = shape[1:]
    else:
        batch, (s0, s1) = 0, elements
        rows, cols = shape
    if batches == 1:
        batch = 0
    elif batch < 0:
        return None
    row, col = _forms(rows, cols, s0, s1)
    return batch, row, col


def plan(a_shape: tuple, a_strides: tuple, b_shape: tuple, b_strides: tuple,
         out_shape: tuple, out_strides: tuple, itemsize: int) -> Gemm | None:
    """The cuBLAS product for ``out = a @ b``, shapes checked already (2-D,
    or 3-D with one batch count, a 2-D input used for every batch) and
    strides in bytes; None when cuBLAS cannot take the layout (a stride
    other than one element along both axes of a matrix, a leading dimension
    smaller than its extent, a stride that is not whole elements, a batch
    stepping backwards, a size past 32-bit) or ``k`` is 0."""
    batches = out_shape[0] if len(out_shape) == 3 else 1
    m, k = a_shape[-2:]
    n = b_shape[-1]
    if not (m and n and k and batches):
        return None
    a = _matrix(a_shape, a_strides, itemsize, batches)
    b = _matrix(b_shape, b_strides, itemsize, batches)
    out = _matrix(out_shape, out_strides, itemsize, batches)
    if a is None or b is None or out is None:
        return None
    if batches > 1 and out[0] <= 0:
        return None
    (a_batch, a_row, a_col), (b_batch, b_row, b_col) = a, b
    out_batch, out_row, out_col = out
    if out_row is not None:
        # cuBLAS computes outᵀ (n x m) = bᵀ (n x k) · aᵀ (k x m).
        transa, lda = (False, b_row) if b_row is not None else (True, b_col)
        transb, ldb = (False, a_row) if a_row is not None else (True, a_col)
        gemm = Gemm(True, transa, transb, n, m, k, lda, ldb, out_row,  # type: ignore[arg-type]
                    b_batch, a_batch, out_batch, batches)
    elif out_col is not None:
        # cuBLAS computes out (m x n) = a (m x k) · b (k x n).
        transa, lda = (False, a_col) if a_col is not None else (True, a_row)
        transb, ldb = (False, b_col) if b_col is not None else (True, b_row)
        gemm = Gemm(False, transa, transb, m, n, k, lda, ldb, out_col,  # type: ignore[arg-type]
                    a_batch, b_batch, out_batch, batches)
    else:
        return None
    if gemm.lda is None or gemm.ldb is None:
        return None
    if max(gemm.m, gemm.n, gemm.k, gemm.lda, gemm.ldb, gemm.ldc, batches) > _INT_MAX:
        return None
    return gemm


# ---------------------------------------------------------------- handles

class _Handle:
    """A cuBLAS handle of one thread on one device, with the stream and
    workspace it was last set to."""

    __slots__ = ("value", "device", "stream", "workspace")

    def __init__(self, value: int, device: int):
        self.value = value
        self.device = device
        self.stream: int | None = None
        self.workspace: int | None = None

    def __del__(self) -> None:
        # Its thread ended: another thread may take the handle.
        try:
            _spare_handles.setdefault(self.device, []).append(self.value)
        except Exception:  # noqa: BLE001  at interpreter exit the module may be gone
            return


_local = threading.local()
# device -> handles no thread holds; device -> spare workspaces; (capture
# key of a stream, device) -> the workspace of the eager calls on it.
_spare_handles: dict[int, list[int]] = {}
_spare_workspaces: dict[int, list[Workspace]] = {}
_eager: OrderedDict[tuple[Any, int], Workspace] = OrderedDict()
_lock = threading.Lock()


def _make_handle() -> int:
    cublas = _cublas()
    with _registry.unsafe_call:
        # cuBLAS works in the context current on the thread: numba's.
        cuda.current_context()
        value = cublas.create()
        cublas.set_math_mode(value, _e().math)
    return value


def _handle(device: int, may_make: bool) -> _Handle | None:
    """This thread's handle on ``device``: its own, a spare one, or, where
    ``may_make``, a new one; None when there is none and none can be made."""
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    handle = handles.get(device)
    if handle is not None:
        return handle
    with _lock:
        spares = _spare_handles.get(device)
        value = spares.pop() if spares else None
    if value is None:
        if not may_make:
            return None
        value = _make_handle()
    handle = handles[device] = _Handle(value, device)
    return handle


# ---------------------------------------------------------------- workspaces

class Workspace:
    """Device memory given to cuBLAS for one user: the eager calls on one
    stream, or one stream of one capture's graph (which keeps it)."""

    __slots__ = ("array", "pointer", "nbytes", "graph_memory")

    def __init__(self, array: Any, nbytes: int, graph_memory: bool = False):
        self.array = array
        start = _backend.device_pointer(array)
        self.pointer = -(-start // _ALIGN) * _ALIGN
        self.nbytes = nbytes
        self.graph_memory = graph_memory


_sizes: dict[int, int] = {}


def _workspace_bytes(device: int) -> int:
    size = _sizes.get(device)
    if size is None:
        major = cuda.get_current_device().compute_capability[0]
        size = _sizes[device] = _WORKSPACE_BYTES[major >= 9]
    return size


def _make_workspace(device: int) -> Workspace:
    nbytes = _workspace_bytes(device)
    return Workspace(cuda.device_array(nbytes + _ALIGN, np.uint8), nbytes)


def _top_up(device: int) -> None:
    """One spare handle and one spare workspace for ``device``, for the
    next capture that needs them; made now, outside any capture."""
    with _lock:
        need_handle = not _spare_handles.get(device)
        need_workspace = not _spare_workspaces.get(device)
    if need_handle:
        value = _make_handle()
        with _lock:
            _spare_handles.setdefault(device, []).append(value)
    if need_workspace:
        workspace = _make_workspace(device)
        with _lock:
            _spare_workspaces.setdefault(device, []).append(workspace)


def _eager_workspace(key: Any, device: int, may_make: bool) -> Workspace | None:
    with _lock:
        workspace = _eager.get((key, device))
        if workspace is not None:
            _eager.move_to_end((key, device))
            return workspace
    if not may_make:
        return None
    workspace = _make_workspace(device)
    with _lock:
        _eager[(key, device)] = workspace
        while len(_eager) > _MAX_EAGER:
            # A call remembered or in flight keeps its own reference.
            _eager.popitem(last=False)
    return workspace


def _capture_workspace(session: Any, key: Any, device: int, handle: int) -> Workspace | str:
    """The workspace the capture ``session`` gives cuBLAS on the stream
    ``handle``, or why there is none."""
    taken = None
    with _lock:
        owned = session.blas
        if owned is None:
            owned = session.blas = {}
        workspace = owned.get(key)
        if workspace is None:
            spares = _spare_workspaces.get(device)
            if spares:
                workspace = taken = owned[key] = spares.pop()
    if taken is not None:
        session.keep(taken)
    if workspace is not None:
        return workspace
    if session.block is not None:
        return (f"the capture has no cuBLAS workspace for this stream, and none can be "
                f"allocated inside {session.block}, where CUDA records no memory nodes")
    if session.thread is not threading.current_thread():
        return ("the capture has no cuBLAS workspace for this stream, and only the thread "
                "that captures allocates inside its graph")
    nbytes = _workspace_bytes(device)
    array = graph_allocate(session, (nbytes + _ALIGN,), np.dtype(np.uint8), 0,
                           "ng.matmul_into()'s cuBLAS workspace", handle=handle)
    return Workspace(array, nbytes, graph_memory=True)


_PREPARE = ("call ng.prepare_matmul(stream=s) (or ng.matmul_into once) on this thread "
            "before the capture")


def _may_allocate(handle: int) -> bool:
    """Whether memory made now for the stream ``handle`` is plain device
    memory: the allocation rule allows it, and this thread captures nothing
    (numba's allocations would then be its capture's graph memory)."""
    if not allocation_allowed(handle):
        return False
    if _sessions:
        me = threading.current_thread()
        return not any(s.thread is me for s in _registry.active())
    return True


def _resources(handle: int, device: int, session: Any) -> tuple[_Handle, Workspace] | str:
    """The handle and workspace for a call on the stream ``handle`` (in the
    capture ``session``, if not None), or why cuBLAS cannot be called."""
    key = _registry.key_of(handle)
    try:
        if session is not None:
            cublas_handle = _handle(device, may_make=False)
            if cublas_handle is None:
                return ("this thread has no cuBLAS handle yet, and making one may allocate "
                        f"device memory, which the capture forbids; {_PREPARE}")
            found = _capture_workspace(session, key, device, handle)
            if isinstance(found, str):
                return f"{found}; {_PREPARE}"
            return cublas_handle, found
        if handle not in LEGACY_DEFAULT_HANDLES and _backend.is_capturing(handle):
            return ("the stream captures, in a capture begun outside numbagraph, whose "
                    "graph numbagraph cannot give a cuBLAS workspace of its own; capture "
                    "with ng.capture to record cuBLAS")
        may_make = _may_allocate(handle)
        cublas_handle = _handle(device, may_make)
        workspace = _eager_workspace(key, device, may_make)
        if cublas_handle is None or workspace is None:
            return ("a capture in progress forbids allocating, or this thread captures, "
                    "and this thread has no cuBLAS handle or workspace for the stream yet; "
                    "call ng.prepare_matmul(stream=s) before the capture begins")
        if may_make:
            _top_up(device)
        return cublas_handle, workspace
    except _cublas().cuBLASError as exc:
        reason = f"cuBLAS could not make a handle ({exc})"
        _broken(reason)
        return reason


# ---------------------------------------------------------------- calls

class Call:
    """One cuBLAS product, ready to run on its thread's handle: what a
    remembered eager call repeats."""

    __slots__ = ("handle", "stream", "workspace", "batched", "args")

    def __init__(self, handle: _Handle, stream: int, workspace: Workspace, batched: bool,
                 args: tuple):
        self.handle = handle
        self.stream = stream
        self.workspace = workspace
        self.batched = batched
        self.args = args


_INSTEAD = ("Capture the work again with the new arrays, or run matmul_into's numba "
            "kernel, whose launches rebind: ng.set_matmul_backend('numba') before capturing")


def _refused(reason: str) -> None:
    if settings.choice == "cublas":
        raise OpError(
            f"ng.matmul_into() cannot call cuBLAS here: {reason}. ng.set_matmul_backend"
            "('cublas') asks for cuBLAS; 'auto' runs the numba kernel instead. Nothing was "
            "launched or recorded")
    warnings.warn(
        f"ng.matmul_into() ran its numba kernel instead of cuBLAS: {reason}",
        CaptureWarning, stacklevel=5)


def gemm_call(handle: int, dtype: np.dtype, gemm: Gemm, a: Any, b: Any, out: Any,
              pointers: tuple[int, int, int]) -> Call | None:
    """The cuBLAS call that computes ``out = a @ b`` as ``gemm`` says, on
    the stream ``handle``, once the checks a launch there passes are passed
    (graph memory, the legacy default stream, an invalidated capture) and
    its handle and workspace found; None where the numba kernel is to run
    instead (with a CaptureWarning), or OpError where cuBLAS was asked for
    by name. A capture's graph keeps the arrays and the workspace."""
    arrays = (a, b, out)
    session = library_work_session(arrays, handle, "ng.matmul_into()")
    found = _resources(handle, _backend.current_device_id(), session)
    if isinstance(found, str):
        _refused(found)
        return None
    cublas_handle, workspace = found
    e = _e()
    compute = e.compute_64f if dtype == np.float64 else (
        e.compute_tf32 if dtype == np.float32 and settings.tf32 else e.compute_32f)
    one, zero = _SCALARS[np.dtype(np.float64 if dtype == np.float64 else np.float32)]
    data = e.data[dtype]
    ptr_a, ptr_b, ptr_out = pointers
    first, second = (ptr_b, ptr_a) if gemm.swap else (ptr_a, ptr_b)
    ops = (e.T if gemm.transa else e.N, e.T if gemm.transb else e.N, gemm.m, gemm.n, gemm.k,
           one.ctypes.data)
    if gemm.batches > 1:
        args = (*ops, first, data, gemm.lda, gemm.stride_a, second, data, gemm.ldb,
                gemm.stride_b, zero.ctypes.data, ptr_out, data, gemm.ldc, gemm.stride_c,
                gemm.batches, compute, e.algo)
    else:
        args = (*ops, first, data, gemm.lda, second, data, gemm.ldb, zero.ctypes.data,
                ptr_out, data, gemm.ldc, compute, e.algo)
    if session is not None:
        session.keep(Fixed("cuBLAS matrix product (ng.matmul_into)", arrays, _INSTEAD))
    return Call(cublas_handle, handle, workspace, gemm.batches > 1, args)


def run(call: Call) -> None:
    """Make the cuBLAS call on its stream (recorded if the stream captures)."""
    cublas = _cublas()
    handle = call.handle
    workspace = call.workspace
    try:
        if handle.stream != call.stream or handle.workspace != workspace.pointer:
            handle.stream = handle.workspace = None
            cublas.set_stream(handle.value, call.stream)
            cublas.set_workspace(handle.value, workspace.pointer, workspace.nbytes)
            handle.stream, handle.workspace = call.stream, workspace.pointer
        if call.batched:
            cublas.gemm_strided_batched_ex(handle.value, *call.args)
        else:
            cublas.gemm_ex(handle.value, *call.args)
    except cublas.cuBLASError as exc:
        raise NumbagraphError(
            f"cuBLAS refused ng.matmul_into() ({exc}); ng.set_matmul_backend('numba') runs "
            "its numba kernel instead") from exc


def finish(call: Call) -> None:
    """After a recorded call: a workspace allocated inside the graph for it
    is freed there."""
    if call.workspace.graph_memory:
        free(call.workspace.array)


def prepare(handle: int) -> str:
    """Make what a cuBLAS call on the stream ``handle`` needs from this
    thread (its handle, the stream's workspace, a spare handle and workspace
    for the next capture), outside any capture; the path matmul_into takes."""
    if not enabled():
        return "numba"
    if (not _may_allocate(handle)
            or (handle not in LEGACY_DEFAULT_HANDLES and _backend.is_capturing(handle))):
        raise OpError(
            "ng.prepare_matmul() makes a cuBLAS handle and workspaces, device memory that a "
            "capture in progress forbids allocating: call it before the capture begins")
    found = _resources(handle, _backend.current_device_id(), None)
    if isinstance(found, str):
        raise OpError(f"ng.prepare_matmul(): {found}")
    return "cublas"
