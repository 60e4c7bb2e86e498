"""Compiling kernels ahead of the capture that launches them.

numba compiles a kernel at its first launch for each new set of argument
types. A first launch inside a capture compiles there, holding the capture
open for the compile (seconds for a large kernel), and a kernel that takes a
:class:`~numbagraph.Condition` cannot be launched before any capture at all,
since a Condition exists only inside one. :func:`precompile` compiles for
the arguments the capture will pass, without launching.
"""

from __future__ import annotations

from typing import Any

from . import _registry
from .backend import active as _backend
from .conditional import Condition

__all__ = ["precompile"]


def _stand_in(arg: Any) -> Any:
    """The value a kernel receives for ``arg``, for typing it."""
    if arg is Condition or isinstance(arg, Condition):
        # A condition reaches kernels as a handle: only its type matters.
        return _backend.condition_argument(0)
    unwrap = _registry.device_wrappers.get(type(arg))
    return arg if unwrap is None else unwrap(arg)


def precompile(kernel: Any, *args: Any) -> None:
    """Compile ``kernel`` now for arguments like ``args``, without launching
    it, so that its launches inside a capture do not compile there.

    Pass the arguments the capture will pass (device arrays, DeviceScalars,
    numbers), and the class ``ng.Condition`` where the kernel takes a
    condition. Only the arguments' types matter. Under the simulator, kernels
    run as Python and there is nothing to compile.

    Parameters
    ----------
    kernel
        A ``@cuda.jit`` kernel.
    *args
        Arguments like those the capture will pass, or ``ng.Condition``
        where the kernel takes a condition.

    Raises
    ------
    TypeError
        ``kernel`` is not a ``@cuda.jit`` kernel, or an argument has no type
        numba can pass to a kernel.
    KernelArgumentError
        The kernel was compiled for explicit signatures and the arguments
        convert to none of them, or to several equally well. Arguments that
        convert to one, as numba's own launch converts them, need no
        compile.

    Examples
    --------
    ```python
    ng.precompile(count_while_below, counter, limit, ng.Condition)
    with ng.capture(s) as cap:
        more = ng.Condition(default=1)
        with ng.while_loop(more):
            count_while_below[1, 1, s](counter, limit, more)
    ```
    """
    stand_ins = tuple(_stand_in(arg) for arg in args)
    _backend.compile_kernel(kernel, stand_ins)
