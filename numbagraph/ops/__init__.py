"""Capture-safe operations that write into outputs allocated beforehand.

A graph cannot allocate, so every op here writes into an ``out`` the caller
allocated before capturing (``ng.empty``, ``ng.zeros``, ...). Each op is a
numba kernel launched on ``stream`` (``matmul_into`` calls cuBLAS instead on
the driver where nvmath-python is installed), so ops and your own kernels mix
freely inside a capture. Inputs are device arrays (numba, or anything with
``__cuda_array_interface__``), numbers, or DeviceScalars, which are read on
the device when the op runs. Every check happens in Python before anything
is launched: a wrong call raises [OpError][numbagraph.OpError] and leaves a
capture in progress as it was.

See docs/ops.md for every op, its signature and the broadcasting rules.

Examples
--------
```python
out = ng.empty(1024, np.float32)
with ng.capture(s) as cap:
    ng.mul_into(x, scale, out, stream=s)    # scale: a DeviceScalar
    ng.add_into(out, y, out, stream=s)
cap.graph.launch()
```
"""

from . import _launch, elementwise, index, linalg, nn, reduce
from .elementwise import *  # noqa: F401,F403
from .index import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .nn import *  # noqa: F401,F403
from .reduce import *  # noqa: F401,F403

__all__ = [*elementwise.__all__, *reduce.__all__, *index.__all__, *linalg.__all__,
           *nn.__all__]

# An eager op called again with the same objects launches what it launched
# before, without its checks (see _launch.repeatable).
for _name in __all__:
    globals()[_name] = _launch.repeatable(globals()[_name])
del _name

# The settings of matmul_into's path (cuBLAS or the numba kernel), as they are.
from .linalg import matmul_backend, prepare_matmul, set_matmul_backend, set_tf32  # noqa: E402

__all__ += ["matmul_backend", "set_matmul_backend", "set_tf32", "prepare_matmul"]
