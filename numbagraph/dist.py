"""Collectives between processes, one GPU each, through NCCL: eager, or
recorded into a capture and replayed with its graph.

``ng.dist.init()`` makes this process's communicator from the launcher that
started it (torchrun, mpirun, or none for one process), and the ``_into``
collectives run on a stream as numbagraph's ops do: checked in Python
before anything is launched or recorded, and recorded by a capture on that
stream (``with ng.capture(s)``), whose graph then keeps the communicator and
the arrays alive. Every rank must replay its graph, as it would make the
calls, for the collectives to meet.

On the CUDA driver this needs NCCL through nvidia's ``nccl4py``
(``pip install -e ".[dist]"``), imported the first time a communicator
is made; ``import numbagraph`` never imports it. On Numba's simulator a
process is one rank: a communicator of world size 1, whose collectives copy
their input into their output, recorded in captures like other device work.

NVLink multicast (NVLS) stays off: ``ng.dist`` sets ``NCCL_NVLS_ENABLE=0``
before NCCL starts in the process, unless it is set already. And NCCL makes
its connections as the communicator is made (``NCCL_RUNTIME_CONNECT=0``,
unless set), so that a collective's first call inside a capture allocates
nothing.
"""

from __future__ import annotations

import gc
import os
import socket
import struct
import time
import weakref
from typing import Any

import numpy as np
from numba import cuda

from . import _hostcalls, _registry
from ._rebind import Fixed, span
from ._registry import sessions as _sessions
from .backend import active as _backend
from .errors import DeviceMismatchError, DistError
from .ops import _launch
from .safety import library_work_session

__all__ = [
    "Communicator",
    "init",
    "unique_id",
    "current",
    "all_reduce_into",
    "broadcast_into",
    "reduce_scatter_into",
    "all_gather_into",
    "OPS",
    "INSTALL",
]

INSTALL = 'pip install -e ".[dist]"'

# NCCL's ncclDataType_t, by NumPy dtype (bfloat16 by name: ml_dtypes').
_DATATYPES = {
    np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2,
    np.dtype(np.uint32): 3, np.dtype(np.int64): 4, np.dtype(np.uint64): 5,
    np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8,
}
_BFLOAT16 = 9

OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
"""The reductions, by name, as NCCL's ``ncclRedOp_t``."""

_UNIQUE_ID_BYTES = 128
# What NCCL reads as it starts, set where the user has not.
_NCCL_DEFAULTS = {"NCCL_NVLS_ENABLE": "0", "NCCL_RUNTIME_CONNECT": "0"}


def _nccl_environment() -> None:
    for name, value in _NCCL_DEFAULTS.items():
        os.environ.setdefault(name, value)


# ---------------------------------------------------------------- communicators

class _Held:
    """What a graph keeps of a communicator it recorded a collective of:
    the communicator, alive, and known to it as in use."""

    __slots__ = ("comm", "__weakref__")

    def __init__(self, comm: Communicator):
        self.comm = comm


class Communicator:
    """This process's place among the ranks of a collective: its ``rank``
    of ``size``, on ``device``.

    Made by :func:`init`. Close it once its work is done, on every rank
    (``close()``, or a ``with`` block); a graph that recorded one of its
    collectives keeps it alive, and it cannot be closed before such a graph
    is closed or dropped.

    Examples
    --------
    ```python
    with ng.dist.init() as comm:
        print(comm.rank, comm.size, comm.device)
    ```
    """

    def __init__(self, handle: Any, rank: int, size: int, device: int, local_rank: int,
                 launcher: str):
        self._handle = handle
        self.rank = rank
        """This process's rank, ``0 <= rank < size``."""
        self.size = size
        """The number of ranks (the world size)."""
        self.device = device
        """The ordinal of the device this rank's collectives run on."""
        self.local_rank = local_rank
        """This process's rank among those of its machine."""
        self.launcher = launcher
        """What the ranks were found from: ``"torchrun"``, ``"mpi"``,
        ``"explicit"`` (arguments) or ``"single"`` (one process)."""
        self._uses: weakref.WeakSet[_Held] = weakref.WeakSet()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has freed the communicator."""
        return self._handle is None

    def close(self) -> None:
        """Finish the communicator's work and free it. Every rank calls it.
        Closing twice does nothing.

        Raises
        ------
        DistError
            A graph that recorded one of its collectives is still alive:
            close or drop it first. Or a capture is in progress: close the
            communicator once it has ended.
        """
        if self._handle is None:
            return
        if self._uses:
            gc.collect()  # graphs dropped but held by a reference cycle
        graphs = len(self._uses)
        if graphs:
            raise DistError(
                f"this communicator cannot be closed: {graphs} recording(s) of its "
                "collectives (graphs, or captures in progress) are alive, and would use "
                "it at their next launch; close those graphs (graph.close()) or drop "
                "them first")
        if _sessions:
            raise DistError(
                "this communicator cannot be closed while a capture is in progress: closing "
                "frees NCCL's device memory, which would break the capture; close it after "
                "every capture has ended")
        with _registry.unsafe_call:
            _backend.dist_close(self._handle)
        self._handle = None
        if _current and _current[0] is self:
            _current.clear()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"device {self.device}"
        return (f"<ng.dist.Communicator rank {self.rank} of {self.size}, {state}, "
                f"from {self.launcher}>")


# The communicator init made last, until it is closed.
_current: list[Communicator] = []
# Communicators made by this process so far: all ranks count alike, which
# keys each one's unique id in a launcher's store.
_made = [0]
# Stores this process serves a unique id from, kept for as long as it runs
# (another rank may read late).
_servers: list[Any] = []


def current() -> Communicator | None:
    """The communicator :func:`init` made last, unless it was closed: the
    one collectives use when given no ``comm=``."""
    return _current[0] if _current else None


def unique_id() -> bytes:
    """A new unique id naming a communicator: made on one rank and given to
    every rank's ``ng.dist.init(rank=, world_size=, unique_id=)``.

    Examples
    --------
    ```python
    uid = ng.dist.unique_id()
    assert len(uid) == 128
    ```
    """
    _nccl_environment()
    reason = _backend.dist_unavailable(1)
    if reason is not None:
        raise DistError(reason)
    return _backend.dist_unique_id()


def _env_int(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise DistError(f"the launcher set {name}={value!r}, which is not a "
                                "number") from None
    return None


_MPI_RANK = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")
_LOCAL_RANK = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID",
               "MV2_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")


def _launcher() -> str:
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return "torchrun"
    if any(name in os.environ for name in _MPI_RANK):
        return "mpi"
    return "single"


def _checked_ranks(rank: Any, size: Any) -> tuple[int, int]:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise DistError(f"world_size must be a positive int, not {size!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < size:
        raise DistError(f"rank must be an int in [0, {size}), not {rank!r}")
    return int(rank), int(size)


def _checked_id(uid: Any) -> bytes:
    try:
        value = bytes(uid)
    except TypeError:
        raise DistError(f"unique_id must be bytes (ng.dist.unique_id()), not "
                        f"{type(uid).__name__}") from None
    if len(value) != _UNIQUE_ID_BYTES:
        raise DistError(f"unique_id must be the {_UNIQUE_ID_BYTES} bytes ng.dist.unique_id() "
                        f"returns, not {len(value)}")
    return value


def _unreached(rank: int, size: int, host: str, port: int, what: str, timeout: float,
               exc: BaseException | None = None) -> DistError:
    """The error of a rank whose exchange of the unique id with rank 0 at
    ``host:port`` failed at ``what``, saying what to check."""
    cause = "" if exc is None else f" ({type(exc).__name__}: {exc})"
    return DistError(
        f"rank {rank} of {size} could not {what}{cause}, exchanging the communicator's "
        f"unique id with rank 0 at {host}:{port}. Check that MASTER_ADDR ({host}) names "
        f"rank 0's machine, reachable from every rank, and MASTER_PORT ({port}) a port "
        f"free there; that no firewall blocks port {port} between the machines; and that "
        f"all {size} ranks were started, each within {timeout:g} s (init(timeout=)) of "
        "the others")


def _torch_exchange(rank: int, size: int, key: str, timeout: float) -> bytes:
    """The unique id rank 0 makes, given to every rank through a TCPStore at
    MASTER_ADDR:MASTER_PORT (torchrun's own, where it serves one)."""
    host = os.environ.get("MASTER_ADDR")
    port = _env_int("MASTER_PORT")
    if not host or port is None:
        raise DistError("RANK and WORLD_SIZE are set but MASTER_ADDR or MASTER_PORT is not: "
                        "start the processes with torchrun, or set both")
    try:
        from torch.distributed import TCPStore
    except ImportError:
        return _socket_exchange(host, port, rank, size, timeout, _backend.dist_unique_id)
    import datetime

    # torchrun's agent serves a store on MASTER_PORT that workers join.
    agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    # torch raises its store's failures as RuntimeErrors (DistNetworkError,
    # DistStoreError), and a timeout as one too or as TimeoutError.
    try:
        store = TCPStore(host, port, None, is_master=rank == 0 and not agent,
                         timeout=datetime.timedelta(seconds=timeout), wait_for_workers=False,
                         multi_tenant=True)
    except (RuntimeError, OSError) as exc:
        raise _unreached(rank, size, host, port, "reach torch's TCPStore", timeout,
                         exc) from None
    if rank == 0:
        uid = _backend.dist_unique_id()
        try:
            store.set(key, uid)
        except (RuntimeError, OSError) as exc:
            raise _unreached(rank, size, host, port, "write its unique id into torch's "
                             "TCPStore", timeout, exc) from None
        _servers.append(store)
        return uid
    try:
        return bytes(store.get(key))
    except (RuntimeError, OSError) as exc:
        raise _unreached(rank, size, host, port, "read rank 0's unique id from torch's "
                         "TCPStore", timeout, exc) from None


def _socket_exchange(host: str, port: int, rank: int, size: int, timeout: float,
                     make: Any) -> bytes:
    """The unique id rank 0 makes (``make()``), sent by rank 0 to each other
    rank that connects to it at ``host:port``, where torch is not
    installed. Every failure of the network is a DistError naming the
    address, the rank and what to check."""
    deadline = time.monotonic() + timeout
    if rank == 0:
        uid = make()
        try:
            server = socket.create_server(("", port))
        except OSError as exc:
            raise _unreached(rank, size, host, port, f"listen on port {port}", timeout,
                             exc) from None
        with server:
            server.settimeout(timeout)
            for sent in range(size - 1):
                try:
                    peer, address = server.accept()
                except socket.timeout:
                    raise _unreached(rank, size, host, port,
                                     f"hear from every rank: {sent} of the {size - 1} others "
                                     f"connected within {timeout:g} s", timeout) from None
                except OSError as exc:
                    raise _unreached(rank, size, host, port, "accept a connection",
                                     timeout, exc) from None
                with peer:
                    try:
                        peer.sendall(struct.pack("!I", len(uid)) + uid)
                    except OSError as exc:
                        raise _unreached(rank, size, host, port,
                                         f"send its unique id to {address[0]}", timeout,
                                         exc) from None
        return uid
    while True:
        try:
            left = max(deadline - time.monotonic(), 0.05)
            with socket.create_connection((host, port), timeout=left) as conn:
                data = b""
                while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
                    chunk = conn.recv(4096)
                    if not chunk:
                        raise ConnectionError("rank 0 closed the connection early")
                    data += chunk
                return data[4:]
        except socket.gaierror as exc:
            # A name that does not resolve now will not within the wait.
            raise _unreached(rank, size, host, port, f"find the machine {host}", timeout,
                             exc) from None
        except OSError as exc:
            # Refused, reset, unreachable or timed out: rank 0 may not be
            # listening yet, so it is tried again until the time is up.
            if time.monotonic() > deadline:
                raise _unreached(rank, size, host, port,
                                 f"reach rank 0 within {timeout:g} s", timeout, exc) from None
            time.sleep(0.05)


def _mpi() -> tuple[Any, int, int, int]:
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise DistError(
            f"the process was started by an MPI launcher, and mpi4py, which ng.dist needs to "
            f"reach the other ranks, does not import ({exc}): `pip install mpi4py`") from None
    world = MPI.COMM_WORLD
    node = world.Split_type(MPI.COMM_TYPE_SHARED)
    local = node.Get_rank()
    node.Free()
    return world, world.Get_rank(), world.Get_size(), local


def init(*, rank: int | None = None, world_size: int | None = None,
         unique_id: bytes | None = None, device: int | None = None,
         timeout: float = 300.0) -> Communicator:
    """Make this process's communicator, and select its device in numba.

    The ranks come from the arguments where given (``rank``,
    ``world_size`` and, for more than one rank, ``unique_id`` from
    :func:`unique_id` on one of them), else from the launcher that started
    the process: torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``: rank 0's unique id goes to the others
    through a ``torch.distributed.TCPStore``), an MPI launcher
    (``OMPI_COMM_WORLD_RANK``, ``PMI_RANK``, ...: through mpi4py's
    ``bcast``), or none: one process, world size 1. Every rank calls it;
    it returns once all have.

    The device is ``device`` if given, else the local rank modulo the
    number of devices; it is made current (``cuda.select_device``) before
    the communicator is made.

    Parameters
    ----------
    rank, world_size, unique_id
        This process's rank, the number of ranks, and the unique id every
        rank is given (not needed for one rank).
    device
        The device ordinal to use.
    timeout
        Seconds to wait for rank 0's unique id.

    Returns
    -------
    Communicator
        Also what collectives use when given no ``comm=``, until closed.

    Raises
    ------
    DistError
        NCCL cannot run here (on the driver without nccl4py: ``pip install
        -e ".[dist]"``; more than one rank on the simulator), the
        arguments or the launcher's environment do not fit, a capture is in
        progress (a communicator allocates device memory), rank 0's unique
        id could not be exchanged at ``MASTER_ADDR:MASTER_PORT`` (the error
        names the address, the rank and what to check), or NCCL refused.

    Examples
    --------
    ```python
    comm = ng.dist.init()            # one process: rank 0 of 1
    assert (comm.rank, comm.size) == (0, 1)
    comm.close()
    ```
    """
    if _sessions:
        raise DistError("ng.dist.init() makes a communicator, which allocates device memory: "
                        "call it before any capture begins, or after they end")
    explicit = rank is not None or world_size is not None or unique_id is not None
    launcher = "explicit" if explicit else _launcher()
    local = _env_int(*_LOCAL_RANK)
    world: Any = None
    if launcher == "explicit":
        if rank is None or world_size is None:
            raise DistError("pass both rank= and world_size= (and unique_id= for more than "
                            "one rank), or none of them to take the launcher's")
        rank, size = _checked_ranks(rank, world_size)
        if size > 1 and unique_id is None:
            raise DistError(f"rank {rank} of {size} needs unique_id=: make it with "
                            "ng.dist.unique_id() on one rank and give it to every rank")
    elif launcher == "torchrun":
        rank, size = _checked_ranks(_env_int("RANK"), _env_int("WORLD_SIZE"))
    elif launcher == "mpi":
        world, rank, size, local = _mpi()
    else:
        rank, size = 0, 1
    if local is None or local < 0:
        local = rank
    uid = None if unique_id is None else _checked_id(unique_id)
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise DistError(f"device must be a device ordinal (int), not {device!r}")
    _nccl_environment()
    reason = _backend.dist_unavailable(size)
    if reason is not None:
        raise DistError(f"ng.dist.init() cannot make a communicator of {size} rank(s): "
                        f"{reason}")
    count = len(cuda.gpus)
    ordinal = device if device is not None else local % count
    if not 0 <= ordinal < count:
        raise DistError(f"device {ordinal} does not exist: this process sees {count}")
    try:
        cuda.select_device(ordinal)
        cuda.current_context()
    except RuntimeError as exc:
        raise DistError(
            f"ng.dist.init() could not make device {ordinal} current ({exc}): numba already "
            "works on another device on this thread; call ng.dist.init() before any other "
            "CUDA work") from None
    _made[0] += 1
    if uid is None:
        if size == 1:
            uid = _backend.dist_unique_id()
        elif launcher == "mpi":
            uid = world.bcast(_backend.dist_unique_id() if rank == 0 else None, root=0)
        else:
            restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            uid = _torch_exchange(rank, size, f"numbagraph/dist/{restart}/{_made[0]}",
                                  timeout)
    with _registry.unsafe_call:
        handle = _backend.dist_communicator(uid, size, rank)
    comm = Communicator(handle, rank, size, ordinal, local, launcher)
    _current[:] = [comm]
    return comm


# ---------------------------------------------------------------- collectives

def _communicator(comm: Communicator | None, name: str) -> Communicator:
    if comm is None:
        comm = current()
        if comm is None:
            raise DistError(f"{name} needs a communicator: call ng.dist.init() first, or pass "
                            "comm=")
    elif not isinstance(comm, Communicator):
        raise DistError(f"{name}: comm= takes an ng.dist.Communicator, not "
                        f"{type(comm).__name__}")
    if comm.closed:
        raise DistError(f"{name}: the communicator is closed")
    return comm


def _array(value: Any, what: str, name: str) -> Any:
    dev = _backend.as_device_array(value) if value is not None else None
    if dev is None:
        raise DistError(f"{name}: {what} must be a device array (numba's, or anything with "
                        f"__cuda_array_interface__), not {type(value).__name__}")
    if not dev.is_c_contiguous():
        raise DistError(f"{name}: {what} is not C-contiguous; NCCL reads and writes "
                        "contiguous memory: pass a contiguous copy")
    return dev


def _datatype(x: Any, out: Any, name: str) -> int:
    dtype = np.dtype(x.dtype)
    if np.dtype(out.dtype) != dtype:
        raise DistError(f"{name}: x is {dtype} and out is {np.dtype(out.dtype)}; NCCL "
                        "needs one dtype for both")
    if dtype.name == "bfloat16":
        return _BFLOAT16
    found = _DATATYPES.get(dtype)
    if found is None:
        raise DistError(f"{name}: NCCL has no type for {dtype}; it takes "
                        "int8, uint8, int32, uint32, int64, uint64, float16, bfloat16, "
                        "float32 and float64")
    return found


def _op(op: Any, name: str) -> int:
    code = OPS.get(op) if isinstance(op, str) else None
    if code is None:
        raise DistError(f"{name}: op={op!r} is not one of {', '.join(map(repr, OPS))}")
    return code


def _count(kind: str, x: Any, out: Any, size: int, name: str) -> int:
    """NCCL's count for ``kind``, once the sizes are checked."""
    if kind in ("all_reduce", "broadcast"):
        if tuple(x.shape) != tuple(out.shape):
            raise DistError(f"{name}: x has shape {tuple(x.shape)} and out "
                            f"{tuple(out.shape)}; they must be the same")
        return int(x.size)
    if kind == "reduce_scatter":
        if x.size != size * out.size:
            raise DistError(f"{name}: x must hold world size x out.size = {size} x "
                            f"{out.size} = {size * out.size} elements (each rank's part "
                            f"after the other), not {x.size}")
        return int(out.size)
    if out.size != size * x.size:
        raise DistError(f"{name}: out must hold world size x x.size = {size} x {x.size} = "
                        f"{size * x.size} elements (each rank's x after the other), "
                        f"not {out.size}")
    return int(x.size)


def _check_memory(kind: str, x: Any, out: Any, comm: Communicator, stream: Any,
                  name: str) -> None:
    _, x0, x1 = span(x)
    _, o0, o1 = span(out)
    if x0 < o1 and o0 < x1 and not (kind in ("all_reduce", "broadcast") and (x0, x1) == (o0, o1)):
        raise DistError(f"{name}: x and out overlap; they must be the same array "
                        "(all_reduce_into and broadcast_into work in place) or apart")
    where = _backend.stream_device_id(stream)
    if where != comm.device:
        raise DeviceMismatchError(
            f"{name}: the stream belongs to device {where} and the communicator to device "
            f"{comm.device}; pass a stream of device {comm.device}")
    for what, dev in (("x", x), ("out", out)):
        if dev.size:
            where = _backend.pointer_device_id(_backend.device_pointer(dev))
            if where != comm.device:
                raise DeviceMismatchError(
                    f"{name}: {what} is memory of device {where} and the communicator's "
                    f"device is {comm.device}; pass arrays of device {comm.device}")


_INSTEAD = ("Capture the work again with the new arrays: NCCL's nodes hold the addresses "
            "they were recorded with")


def _collective(kind: str, x: Any, out: Any, op: Any, root: int, stream: Any,
                comm: Communicator | None, name: str) -> None:
    comm = _communicator(comm, name)
    if stream is None:
        raise DistError(f"{name}: stream= is required: the stream to run on, or the "
                        "capturing stream to record into")
    try:
        handle = _backend.stream_handle(stream)
    except TypeError as exc:
        raise DistError(f"{name}: {exc}") from None
    x_dev, out_dev = _array(x, "x", name), _array(out, "out", name)
    datatype = _datatype(x_dev, out_dev, name)
    code = _op(op, name) if kind in ("all_reduce", "reduce_scatter") else 0
    count = _count(kind, x_dev, out_dev, comm.size, name)
    _check_memory(kind, x_dev, out_dev, comm, stream, name)
    arrays = (x_dev, out_dev)
    session = library_work_session(arrays, handle, name)
    if session is not None and session.block is not None:
        raise DistError(
            f"{name} cannot be recorded inside {session.block}: NCCL may record "
            "nodes CUDA forbids in a conditional body; record the collective "
            "before or after the block")
    if _hostcalls.attention[0]:
        _hostcalls.refuse_here(name)
    if count == 0:
        return
    if session is not None:
        held = _Held(comm)
        comm._uses.add(held)
        session.keep(held)
        session.keep(Fixed(f"NCCL {kind} ({name})", arrays, _INSTEAD))
    _launch.device_step(_backend.dist_collective, comm._handle, kind, x_dev, out_dev, count,
                        datatype, code, root, handle)


def all_reduce_into(x: Any, out: Any, op: str = "sum", *, stream: Any,
                    comm: Communicator | None = None) -> None:
    """``out`` = the reduction (``op``) over every rank of its ``x``,
    elementwise; the same on every rank. ``x`` may be ``out`` (in place).

    Parameters
    ----------
    x, out
        Device arrays of one shape and dtype, C-contiguous, of the
        communicator's device.
    op
        ``"sum"``, ``"prod"``, ``"max"``, ``"min"`` or ``"avg"``.
    stream
        The stream it runs on, or is recorded into while it captures.
    comm
        The communicator; :func:`current` when not given.

    Raises
    ------
    DistError
        Operands that do not fit, a closed communicator, or a conditional
        body; raised before anything is launched or recorded.
    DeviceMismatchError
        The stream or an array is not of the communicator's device.

    Examples
    --------
    ```python
    comm = ng.dist.init()
    s = cuda.stream()
    grad = cuda.to_device(np.arange(4, dtype=np.float32), stream=s)
    total = cuda.device_array_like(grad, stream=s)
    ng.dist.all_reduce_into(grad, total, stream=s)
    assert (total.copy_to_host(stream=s) == np.arange(4) * comm.size).all()
    comm.close()
    ```
    """
    _collective("all_reduce", x, out, op, 0, stream, comm, "ng.dist.all_reduce_into()")


def broadcast_into(x: Any, out: Any, *, root: int = 0, stream: Any,
                   comm: Communicator | None = None) -> None:
    """``out`` = rank ``root``'s ``x``, on every rank (``x`` is read on the
    root only). ``x`` may be ``out``.

    Parameters
    ----------
    x, out
        Device arrays of one shape and dtype, C-contiguous.
    root
        The rank whose ``x`` every rank receives.
    stream, comm
        As for :func:`all_reduce_into`.

    Raises
    ------
    DistError
        As for :func:`all_reduce_into`, or a root that is not a rank.

    Examples
    --------
    ```python
    with ng.dist.init() as comm:
        s = cuda.stream()
        w = cuda.to_device(np.ones(8, np.float32), stream=s)
        ng.dist.broadcast_into(w, w, root=0, stream=s)
        s.synchronize()
    ```
    """
    name = "ng.dist.broadcast_into()"
    size = _communicator(comm, name).size
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < size:
        raise DistError(f"{name}: root must be a rank, an int in [0, {size}), not {root!r}")
    _collective("broadcast", x, out, None, int(root), stream, comm, name)


def reduce_scatter_into(x: Any, out: Any, op: str = "sum", *, stream: Any,
                        comm: Communicator | None = None) -> None:
    """``out`` on rank ``r`` = the reduction over every rank of part ``r``
    of its ``x``, ``x`` being ``world size`` parts of ``out.size``
    elements, one after the other.

    Parameters
    ----------
    x
        ``world size * out.size`` elements, C-contiguous.
    out
        This rank's part of the result.
    op, stream, comm
        As for :func:`all_reduce_into`.

    Raises
    ------
    DistError
        As for :func:`all_reduce_into`.

    Examples
    --------
    ```python
    with ng.dist.init() as comm:
        s = cuda.stream()
        x = cuda.to_device(np.ones(4 * comm.size, np.float32), stream=s)
        part = cuda.device_array(4, np.float32, stream=s)
        ng.dist.reduce_scatter_into(x, part, stream=s)
        s.synchronize()
    ```
    """
    _collective("reduce_scatter", x, out, op, 0, stream, comm,
                "ng.dist.reduce_scatter_into()")


def all_gather_into(x: Any, out: Any, *, stream: Any,
                    comm: Communicator | None = None) -> None:
    """``out`` = every rank's ``x``, one after the other in rank order
    (``world size * x.size`` elements), on every rank.

    Parameters
    ----------
    x
        This rank's part, C-contiguous.
    out
        ``world size * x.size`` elements, C-contiguous.
    stream, comm
        As for :func:`all_reduce_into`.

    Raises
    ------
    DistError
        As for :func:`all_reduce_into`.

    Examples
    --------
    ```python
    with ng.dist.init() as comm:
        s = cuda.stream()
        x = cuda.to_device(np.full(3, comm.rank, np.int32), stream=s)
        everyone = cuda.device_array(3 * comm.size, np.int32, stream=s)
        ng.dist.all_gather_into(x, everyone, stream=s)
        s.synchronize()
    ```
    """
    _collective("all_gather", x, out, None, 0, stream, comm, "ng.dist.all_gather_into()")
