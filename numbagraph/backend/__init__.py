"""The one seam that knows which backend runs.

``driver`` records launches into real CUDA graphs through cuda.core and
cuda.bindings; ``simulator`` runs the same API on Numba's CUDA simulator,
recording launches as Python calls and replaying them in order. Each is
three modules (core, ``_conditional``, ``_ops``) that together implement
:class:`~numbagraph.backend.interface.Backend`; :data:`active` holds exactly
that interface's members for the backend in use. Everything above this
package calls the backend through :data:`active` and never asks which one it
got.

Selection happens once, before ``numba.cuda`` is first imported:

* ``NUMBAGRAPH_BACKEND=simulator`` or ``NUMBA_ENABLE_CUDASIM=1`` picks the
  simulator; ``NUMBAGRAPH_BACKEND=cuda`` picks the driver.
* Otherwise the driver is picked when a CUDA device answers, and the
  simulator when none does, so importing numbagraph never fails on a machine
  without a GPU.
* If ``numba.cuda`` was imported before numbagraph, its choice stands.
"""

from __future__ import annotations

import ctypes
import os
import sys

_CHOICES = ("auto", "cuda", "simulator")


def _cuda_device_present() -> bool:
    """Whether the CUDA driver loads and reports at least one device."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return False
    count = ctypes.c_int(0)
    try:
        if lib.cuInit(0) != 0:
            return False
        return lib.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    except (AttributeError, OSError):
        return False


def _check_numba_choice(wanted: str) -> None:
    """Follow the backend numba.cuda chose when it was imported first, or say
    exactly why that cannot work."""
    from numba.cuda.core import config

    simulated = bool(config.ENABLE_CUDASIM)
    # NUMBAGRAPH_BACKEND is no way out here: it acts only before numba.cuda loads.
    fix = (
        "import numbagraph before numba.cuda (numbagraph then picks the backend), "
        "or set NUMBA_ENABLE_CUDASIM=1 before Python starts"
    )
    if wanted == "simulator" and not simulated:
        raise ImportError(
            "NUMBAGRAPH_BACKEND=simulator cannot take effect: numba.cuda was "
            "imported before numbagraph and chose the CUDA driver. To use the "
            "simulator, import numbagraph before numba.cuda, or set "
            "NUMBA_ENABLE_CUDASIM=1 before Python starts"
        )
    if wanted == "cuda" and simulated:
        raise ImportError(
            "NUMBAGRAPH_BACKEND=cuda cannot take effect: numba.cuda was imported "
            "before numbagraph with NUMBA_ENABLE_CUDASIM=1 and runs its simulator; "
            "unset NUMBA_ENABLE_CUDASIM before Python starts"
        )
    if not simulated and not _cuda_device_present():
        raise ImportError(
            "numba.cuda was imported before numbagraph and chose the CUDA driver, "
            "but no CUDA device answers on this machine, so nothing could run. "
            f"To run on Numba's CUDA simulator instead, {fix}"
        )


def _select() -> None:
    wanted = os.environ.get("NUMBAGRAPH_BACKEND", "auto").strip().lower() or "auto"
    if wanted not in _CHOICES:
        raise ImportError(
            f"NUMBAGRAPH_BACKEND={wanted!r} is not a backend; "
            f"use one of {', '.join(_CHOICES)}"
        )
    if "numba.cuda" in sys.modules:
        _check_numba_choice(wanted)  # numba.cuda read its configuration already
        return
    if wanted == "simulator":
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    elif wanted == "cuda":
        os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
    elif "NUMBA_ENABLE_CUDASIM" not in os.environ and not _cuda_device_present():
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


_select()

from numba.cuda.core import config as _numba_config  # noqa: E402

from ._streams import PER_THREAD_HANDLE, capture_key  # noqa: E402
from .interface import Backend, bind  # noqa: E402

if _numba_config.ENABLE_CUDASIM:
    from . import simulator, simulator_conditional, simulator_memory, simulator_ops
    _modules: tuple = (simulator, simulator_conditional, simulator_ops, simulator_memory)
else:
    from . import (
        driver, driver_conditional, driver_divert, driver_host, driver_launch, driver_memory,
        driver_ops,
    )
    _modules = (driver, driver_conditional, driver_ops, driver_memory, driver_launch, driver_host,
                driver_divert)

# Each backend's reading of a captured graph's nodes.
if _numba_config.ENABLE_CUDASIM:
    from . import simulator_nodes as _nodes
else:
    from . import driver_nodes as _nodes  # type: ignore[no-redef]
_modules += (_nodes,)

# Each backend's several streams in one capture, and child graphs.
if _numba_config.ENABLE_CUDASIM:
    from . import simulator_streams as _streams_of
else:
    from . import driver_streams as _streams_of  # type: ignore[no-redef]
_modules += (_streams_of,)

# Each backend's collectives (NCCL on the driver, imported at first use).
if _numba_config.ENABLE_CUDASIM:
    from . import simulator_dist as _dist
else:
    from . import driver_dist as _dist  # type: ignore[no-redef]
_modules += (_dist,)

# Each backend's device-updatable kernel nodes.
if _numba_config.ENABLE_CUDASIM:
    from . import simulator_devnodes as _devnodes
else:
    from . import driver_devnodes as _devnodes  # type: ignore[no-redef]
_modules += (_devnodes,)

active: Backend = bind(_modules[0].NAME, *_modules)

__all__ = ["active", "capture_key", "PER_THREAD_HANDLE"]
