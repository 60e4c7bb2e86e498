"""numbagraph: CUDA graphs for Numba-CUDA kernels.

Capture ``@cuda.jit`` launches made on a stream into a graph, replay it as
one submission, and change what it computes between replays through device
scalars. Runs on the CUDA driver, or on Numba's CUDA simulator where no GPU
is present.
"""

from .backend import active as _backend
from .capture import CAPTURE_MODES, begin_capture, capture, end_capture, is_capturing
from .conditional import (
    Condition,
    ConditionalBlock,
    if_else,
    if_then,
    set_condition,
    switch,
    while_loop,
)
from .errors import (
    CaptureError,
    ConditionalError,
    GraphClosedError,
    NumbagraphError,
    ScalarValueError,
)
from .graph import CapturedGraph
from .scalar import SCALAR_DTYPES, DeviceScalar
from . import ops  # noqa: E402
from .alloc import empty, empty_like, zeros, zeros_like  # noqa: E402
from .errors import OpError  # noqa: E402
from .ops import *  # noqa: E402,F401,F403  every op, as listed in ops.__all__
from . import safety as _safety  # noqa: F401,E402  guards numba's entry points
from .errors import (  # noqa: E402
    AllocationInCaptureError,
    CaptureInvalidatedError,
    CaptureStateError,
    ForeignStreamInCaptureError,
    HostArrayInCaptureError,
    HostCopyInCaptureError,
    SyncInCaptureError,
    UncapturableOperationError,
)

__version__ = "0.1.0"

__all__ = [
    "backend",
    "capture",
    "begin_capture",
    "end_capture",
    "is_capturing",
    "CAPTURE_MODES",
    "CapturedGraph",
    "DeviceScalar",
    "SCALAR_DTYPES",
    "NumbagraphError",
    "CaptureError",
    "CaptureStateError",
    "CaptureInvalidatedError",
    "UncapturableOperationError",
    "AllocationInCaptureError",
    "HostArrayInCaptureError",
    "HostCopyInCaptureError",
    "SyncInCaptureError",
    "ForeignStreamInCaptureError",
    "GraphClosedError",
    "ScalarValueError",
    "Condition",
    "ConditionalBlock",
    "set_condition",
    "while_loop",
    "if_then",
    "if_else",
    "switch",
    "ConditionalError",
]

__all__ += ["ops", "OpError", "empty", "zeros", "empty_like", "zeros_like", *ops.__all__]


def backend() -> str:
    """``"cuda"`` on the CUDA driver, ``"simulator"`` on Numba's simulator."""
    return _backend.NAME
