"""What both backends share in typing a launch's arguments."""

from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap
from typing import Any, Callable

import numpy as np
from numba.cuda import types as numba_types

from ..errors import KernelArgumentError


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


_NUMBERS = (bool, int, float, complex, np.number, np.bool_)
# The terminal colours numba's messages may carry.
_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


@functools.lru_cache(maxsize=1024)
def _indexed_parameters(code: Any) -> tuple[str, ...]:
    """The parameters of the function of ``code`` that its source indexes
    as they were passed (``n[0]``, never assigned before); none where the
    source cannot be read."""
    try:
        source = textwrap.dedent(inspect.getsource(code))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError):
        return ()
    function = next((node for node in ast.walk(tree)
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     and node.name == code.co_name), None)
    if function is None:
        return ()
    assigned = {node.id for node in ast.walk(function)
                if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load)}
    indexed = {node.value.id for node in ast.walk(function)
               if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)}
    names = code.co_varnames[:code.co_argcount]
    return tuple(name if name in indexed and name not in assigned else ""
                 for name in names)


def indexed_numbers(py_func: Any, args: tuple) -> list[tuple[int, str]]:
    """``(position, parameter)`` of each number among ``args`` that the
    kernel ``py_func`` indexes where it reads the parameter (``n[0]``): a
    launch numba cannot type, as a number has no elements."""
    code = getattr(py_func, "__code__", None)
    if code is None:
        return []
    indexed = _indexed_parameters(code)
    return [(i, indexed[i]) for i, arg in enumerate(args[:len(indexed)])
            if indexed[i] and isinstance(arg, _NUMBERS)]


def untyped_launch(kernel_name: str, py_func: Any, args: tuple, types: tuple | None,
                   why: str) -> KernelArgumentError:
    """The error of a launch of a kernel that numba cannot type with ``args``
    (of numba ``types``, where known; ``why``: numba's reason), naming the
    argument: a number the kernel indexes, which a DeviceScalar replaces, or
    else each argument with its type."""
    found = indexed_numbers(py_func, args)
    if found:
        i, name = found[0]
        return KernelArgumentError(
            f"argument {i} ({name}) given to {kernel_name} is a {type(args[i]).__name__}, "
            f"and {kernel_name} indexes it ({name}[...]): a number has no elements, so "
            f"numba cannot compile {kernel_name} for it. Pass a DeviceScalar "
            f"(ng.DeviceScalar({args[i]!r}, dtype, stream=s)), or a one-element device "
            "array, whose element the kernel reads on the device. Nothing was launched "
            "or recorded; a capture goes on")
    code = getattr(py_func, "__code__", None)
    names = code.co_varnames[:code.co_argcount] if code is not None else ()
    given = ", ".join(
        f"{names[i] if i < len(names) else f'argument {i}'}: "
        f"{types[i] if types is not None else type(arg).__name__}"
        for i, arg in enumerate(args))
    lines = [line.strip() for line in _ESCAPES.sub("", why).splitlines()]
    first = next((line for line in lines if line and not line.startswith("Failed in")),
                 "numba's typing failed")
    return KernelArgumentError(
        f"numba cannot compile {kernel_name} for the arguments given "
        f"({kernel_name}({given})): {first}. Pass arguments of the types the kernel "
        "reads them as (an array where it indexes one, a number where it computes "
        "with one). Nothing was launched or recorded; a capture goes on")
