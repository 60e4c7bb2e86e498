"""Capture-safe operations that write into outputs allocated beforehand.

A graph cannot allocate, so every op here writes into an ``out`` the caller
allocated before capturing (``ng.empty``, ``ng.zeros``, ...). Each op is a
numba kernel launched on ``stream``, so ops and your own kernels mix freely
inside a capture. Inputs are device arrays (numba, or anything with
``__cuda_array_interface__``), numbers, or DeviceScalars, which are read on
the device when the op runs. Every check happens in Python before anything
is launched: a wrong call raises :class:`~numbagraph.OpError` and leaves a
capture in progress as it was.

Example::

    out = ng.empty(1024, np.float32)
    with ng.capture(s) as cap:
        ng.mul_into(x, scale, out, stream=s)    # scale: a DeviceScalar
        ng.add_into(out, y, out, stream=s)
    cap.graph.launch()

See docs/ops.md for every op, its signature and the broadcasting rules.
"""

from .elementwise import (
    abs_into,
    add_into,
    astype_into,
    axpy_into,
    copy_into,
    div_into,
    exp_into,
    fill_into,
    gelu_into,
    log_into,
    maximum_into,
    minimum_into,
    mul_into,
    neg_into,
    pow_into,
    relu_into,
    rsqrt_into,
    sigmoid_into,
    sqrt_into,
    sub_into,
    tanh_into,
    where_into,
)
from .index import put_into, take_into
from .linalg import matmul_into, matvec_into
from .nn import layernorm_into, rmsnorm_into, softmax_into
from .reduce import (
    argmax_into,
    argmin_into,
    dot_into,
    max_into,
    mean_into,
    min_into,
    norm2_into,
    sum_into,
)

__all__ = [
    # elementwise
    "add_into", "sub_into", "mul_into", "div_into",
    "maximum_into", "minimum_into", "pow_into",
    "neg_into", "abs_into", "exp_into", "log_into", "sqrt_into", "rsqrt_into",
    "tanh_into", "sigmoid_into", "relu_into", "gelu_into", "copy_into",
    "fill_into", "axpy_into", "where_into", "astype_into",
    # reductions
    "sum_into", "mean_into", "max_into", "min_into", "argmax_into", "argmin_into",
    "dot_into", "norm2_into",
    # indexing by a device scalar
    "take_into", "put_into",
    # linear algebra and rows
    "matvec_into", "matmul_into", "softmax_into", "layernorm_into", "rmsnorm_into",
]
