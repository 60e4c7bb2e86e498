"""Collectives on Numba's simulator: one process is one rank, so a
communicator has one rank, and each collective of one rank is a copy of
its input into its output (the sum, product, maximum, minimum or average
of one value is that value), run in the stream's order or recorded while
it captures, as the simulator's other device work is."""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np

from .simulator import _record_or_run

_UNIQUE_ID_BYTES = 128


class _Communicator:
    """A communicator of one rank."""

    __slots__ = ("unique_id",)

    def __init__(self, unique_id: bytes):
        self.unique_id = unique_id


def dist_unavailable(size: int) -> str | None:
    """One rank runs here; several need the CUDA driver and NCCL."""
    if size == 1:
        return None
    return (f"a communicator of {size} ranks needs the CUDA driver and NCCL; Numba's CUDA "
            "simulator runs one process as one rank (world size 1)")


def dist_unique_id() -> bytes:
    """A new unique id, random bytes of NCCL's length."""
    return os.urandom(_UNIQUE_ID_BYTES)


def dist_communicator(unique_id: bytes, size: int, rank: int) -> _Communicator:
    """The communicator of this one rank (``size`` 1, ``rank`` 0, checked
    by the caller)."""
    return _Communicator(bytes(unique_id))


def _one_rank(recv: np.ndarray, send: np.ndarray, count: int) -> None:
    np.copyto(recv.reshape(-1)[:count], send.reshape(-1)[:count])


def dist_collective(comm: Any, kind: str, send: Any, recv: Any, count: int,
                    datatype: int, op: int, root: int, handle: int) -> None:
    """The collective of one rank: ``count`` elements of ``send`` copied
    into ``recv`` (nothing where they are the same memory)."""
    if count == 0 or send._ary.__array_interface__["data"][0] == (
            recv._ary.__array_interface__["data"][0]):
        return
    _record_or_run(handle, functools.partial(_one_rank, recv._ary, send._ary, count))


def dist_close(comm: Any) -> None:
    """A communicator of one rank holds nothing to free."""
