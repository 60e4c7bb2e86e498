"""What both backends share in typing a launch's arguments."""

from __future__ import annotations

from typing import Any, Callable

from numba.cuda import types as numba_types


def checked_types(kernel_name: str, typeof: Callable[[Any], Any], args: tuple) -> tuple:
    """``typeof`` of each of ``args``; TypeError, naming the argument, for
    one numba cannot pass to a kernel."""
    types = []
    for i, arg in enumerate(args):
        try:
            ty = typeof(arg)
        except Exception:  # noqa: BLE001  numba's typing errors vary by version
            ty = None
        if ty is None or ty == numba_types.pyobject:
            raise TypeError(
                f"argument {i} given to {kernel_name} is a {type(arg).__name__}, which "
                "numba cannot pass to a kernel")
        types.append(ty)
    return tuple(types)
