"""numbagraph: CUDA graphs for Numba-CUDA kernels.

Capture ``@cuda.jit`` launches made on a stream into a graph, replay it as
one submission, and change what it computes between replays through device
scalars. Runs on the CUDA driver, or on Numba's CUDA simulator where no GPU
is present.
"""

# The backend is chosen before anything imports numba.cuda.
from .backend import active as _backend  # noqa: I001

from . import _patches, alloc, capture as _capture, conditional, errors, graph, graphed as _graphed, host as _host, launch as _launch, loops, ops, precompile as _precompile, scalar
from .alloc import *  # noqa: F401,F403
from .capture import *  # noqa: F401,F403
from .conditional import *  # noqa: F401,F403
from . import devnodes as _devnodes
from .devnodes import *  # noqa: F401,F403
from .errors import *  # noqa: F401,F403
from .graph import *  # noqa: F401,F403
from . import nodes as _nodes
from .nodes import Node, NodeArg  # noqa: F401
from .graphed import GraphedCacheInfo, GraphedFunction, graphed  # noqa: F401
from .host import on_host  # noqa: F401
from .fork import fork  # noqa: F401  (the class; numbagraph.fork the module before this)
from .launch import LaunchRecord, launch_record  # noqa: F401
from .loops import *  # noqa: F401,F403
from .ops import *  # noqa: F401,F403
from .precompile import precompile  # noqa: F401
from . import dist  # noqa: F401  (ng.dist; NCCL is imported at its first communicator)
from .scalar import *  # noqa: F401,F403

__version__ = "0.2.0"

# numba's entry points are checked, and launches pass through numbagraph,
# from here on.
_patches.install()


def backend() -> str:
    """``"cuda"`` on the CUDA driver, ``"simulator"`` on Numba's simulator.

    The backend is chosen once, before ``numba.cuda`` is imported: the
    simulator where there is no GPU, or where ``NUMBAGRAPH_BACKEND=simulator``
    or ``NUMBA_ENABLE_CUDASIM=1`` is set before Python starts. The whole API
    behaves the same on both.

    Returns
    -------
    str
        ``"cuda"`` or ``"simulator"``.

    Examples
    --------
    ```python
    if ng.backend() == "simulator":
        print("no GPU: kernels run on Numba's CUDA simulator")
    ```
    """
    return _backend.NAME


__all__ = [
    "backend", "ops",
    *_capture.__all__, *graph.__all__, *_nodes.__all__, *scalar.__all__, *conditional.__all__, *_devnodes.__all__,
    *alloc.__all__, *errors.__all__, *ops.__all__, *_precompile.__all__, *_graphed.__all__, *_launch.__all__, *loops.__all__,
    *_host.__all__,
    "fork", "dist",
]
