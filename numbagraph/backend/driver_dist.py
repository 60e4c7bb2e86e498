"""Collectives on the driver through NCCL, with NVIDIA's nccl4py bindings.

The one module that imports nccl4py (``pip install -e ".[dist]"``), and
only when a communicator is asked for: ``import numbagraph`` never does.
NCCL launches its kernels through the CUDA runtime on the stream it is
given, so a collective on a capturing stream is recorded by the capture as
NCCL's own nodes; numba sees none of it.
"""

from __future__ import annotations

import threading
from typing import Any

from ..errors import DistError

# numbagraph is not on a package index yet: its extras install from its checkout.
INSTALL = 'pip install -e ".[dist]"'

# [(nccl4py's bindings module or None, why it cannot run or None)], once tried.
_loaded: list[tuple[Any, str | None]] = []
_lock = threading.Lock()

_CALLS = ("all_reduce", "broadcast", "reduce_scatter", "all_gather")


def _load() -> tuple[Any, str | None]:
    try:
        from nccl.bindings import nccl
    except ImportError as exc:
        return None, (f"nccl4py is not installed ({exc}); `{INSTALL}`, run from "
                      "numbagraph's repository root, installs it with NCCL's library")
    except Exception as exc:  # noqa: BLE001  a broken install says why
        return None, f"nccl4py did not import ({type(exc).__name__}: {exc})"
    try:
        nccl.get_version()  # loads libnccl
    except Exception as exc:  # noqa: BLE001  the loader's own error says what it looked for
        return None, (f"nccl4py could not load libnccl ({type(exc).__name__}: {exc}); install "
                      "NCCL for the CUDA in use: `pip install nvidia-nccl-cu13` (or -cu12)")
    return nccl, None


def _nccl() -> Any:
    if not _loaded:
        with _lock:
            if not _loaded:
                _loaded.append(_load())
    nccl, reason = _loaded[0]
    if nccl is None:
        raise DistError(f"ng.dist needs NCCL: {reason}")
    return nccl


def dist_unavailable(size: int) -> str | None:
    """Why NCCL cannot run here (imported and loaded the first time it is
    asked), or None."""
    try:
        _nccl()
    except DistError as exc:
        return str(exc)
    return None


def _refused(what: str, exc: Exception) -> DistError:
    return DistError(f"NCCL refused {what}: {exc}")


def dist_unique_id() -> bytes:
    """``ncclGetUniqueId``: 128 bytes naming a new communicator."""
    nccl = _nccl()
    try:
        return bytes(nccl.get_unique_id())
    except nccl.NCCLError as exc:
        raise _refused("a unique id (ncclGetUniqueId)", exc) from exc


def dist_communicator(unique_id: bytes, size: int, rank: int) -> Any:
    """``ncclCommInitRank`` on the current device (numba's context, made
    current by the caller)."""
    nccl = _nccl()
    try:
        return nccl.comm_init_rank_scalable(size, rank, 1, bytearray(unique_id), 0)
    except nccl.NCCLError as exc:
        raise _refused(f"rank {rank} of {size} (ncclCommInitRank)", exc) from exc


def dist_collective(comm: Any, kind: str, send: Any, recv: Any, count: int,
                    datatype: int, op: int, root: int, handle: int) -> None:
    """The NCCL call for ``kind`` on the stream ``handle``."""
    nccl = _nccl()
    s, r = send.device_ctypes_pointer.value, recv.device_ctypes_pointer.value
    try:
        if kind == "all_reduce":
            nccl.all_reduce(s, r, count, datatype, op, comm, handle)
        elif kind == "broadcast":
            nccl.broadcast(s, r, count, datatype, root, comm, handle)
        elif kind == "reduce_scatter":
            nccl.reduce_scatter(s, r, count, datatype, op, comm, handle)
        elif kind == "all_gather":
            nccl.all_gather(s, r, count, datatype, comm, handle)
        else:
            raise ValueError(f"{kind!r} is not one of {_CALLS}")
    except nccl.NCCLError as exc:
        raise _refused(kind, exc) from exc


def dist_close(comm: Any) -> None:
    """``ncclCommFinalize`` (its work flushed) then ``ncclCommDestroy``."""
    nccl = _nccl()
    try:
        nccl.comm_finalize(comm)
        nccl.comm_destroy(comm)
    except nccl.NCCLError as exc:
        raise _refused("closing the communicator", exc) from exc
