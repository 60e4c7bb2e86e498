"""What a captured graph holds, node by node: records to read, a table to
print and a drawing to render.

The backend reads the graph itself (``backend.describe_graph``): each
node's kind, dependencies and parameters, a kernel node's kernel, a
conditional node's bodies. The capture saw every kernel launch, with the
arguments the user passed (``safety.on_launch`` keeps ``(kernel, args)``
with the graph): kernel nodes are matched to those launches, per kernel, in
the order they were made, which is the order of the nodes, bodies read
where their conditional node stands. Arguments are described without
holding them, so that a rebinding still drops the arrays it replaces.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
from collections import deque
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from . import _registry
from .backend import active as _backend
from .errors import NumbagraphError

__all__ = ["Node", "NodeArg"]

KINDS = ("kernel", "memset", "memcpy", "conditional", "child", "host", "event", "memory",
         "empty", "other")
"""Every kind of node a record may be."""


@dataclasses.dataclass(frozen=True)
class NodeArg:
    """One argument a kernel node was given (or the condition a conditional
    node reads), described without the object itself.

    Attributes
    ----------
    kind
        ``"array"`` (a device array), ``"scalar"`` (a number passed by
        value), ``"DeviceScalar"``, ``"Condition"``, or ``"other"``.
    dtype
        Arrays, scalars and DeviceScalars: the NumPy dtype's name (a Python
        int is ``"int64"``, a float ``"float64"``, as a launch types them).
    shape
        Arrays: the shape.
    value
        Scalars: the value passed; Conditions: the default (None: none).
    name
        DeviceScalars and Conditions: the name they were made with, or None.
    type
        ``"other"``: the Python type's name.

    Examples
    --------
    ```python
    pos = ng.DeviceScalar(0, dtype=np.int32, stream=s, name="pos")
    with ng.capture(s) as cap:
        step[1, 32, s](x, pos)
    print(cap.graph.nodes[0].args[1])     # pos=DeviceScalar(int32)
    ```
    """

    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] | None = None
    value: Any = None
    name: str | None = None
    type: str | None = None

    def __str__(self) -> str:
        prefix = "" if self.name is None else f"{self.name}="
        if self.kind == "array":
            dims = ", ".join(str(d) for d in self.shape or ())
            return f"{self.dtype}[{dims}]"
        if self.kind == "scalar":
            return f"{self.dtype}({self.value!r})"
        if self.kind == "DeviceScalar":
            return f"{prefix}DeviceScalar({self.dtype})"
        if self.kind == "Condition":
            return f"{prefix}Condition(default={self.value!r})"
        return self.type or self.kind


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of a [CapturedGraph][numbagraph.CapturedGraph], as
    [CapturedGraph.nodes][numbagraph.CapturedGraph.nodes] lists them: the
    same records on the driver and on the simulator.

    Attributes
    ----------
    kind
        ``"kernel"``, ``"memset"``, ``"memcpy"``, ``"conditional"``,
        ``"child"`` (a child graph), ``"host"`` (a host function),
        ``"event"``, ``"memory"`` (an allocation or a free of graph-owned
        memory), ``"empty"``, or ``"other"`` (a node numbagraph never
        records).
    depends
        The positions of the nodes it depends on, in the same tuple (the
        graph's, or the body's it is in).
    name
        Kernels: the kernel's Python name (None for a kernel that no
        ``@cuda.jit`` kernel of the capture runs).
    source
        Kernels: ``"file:line"`` of the kernel's Python function.
    grid, block
        Kernels: the launch's dimensions, as ``(x, y, z)``.
    shared
        Kernels: the bytes of dynamic shared memory.
    args
        Kernels: one [NodeArg][numbagraph.NodeArg] per argument, as the
        launch was given them; conditional nodes: the Condition they read,
        where a kernel of the capture was given it.
    nbytes
        Memsets, copies and memory nodes: the bytes set, copied, allocated
        or freed.
    value, element_size
        Memsets: the value each element is set to (its bits, as an
        unsigned int) and the element's size in bytes. A DeviceScalar's
        recorded update is a memset of its value's bits (two 4-byte ones
        for an 8-byte scalar); a zero fill one of 0 over 1-byte elements.
    direction
        Copies: ``"device to device"``, ``"device to host"``,
        ``"host to device"`` or ``"host to host"``.
    action
        Memory nodes: ``"alloc"`` or ``"free"``; event nodes: ``"record"``
        or ``"wait"``.
    conditional
        Conditional nodes: ``"while"``, ``"if"`` (with one body, or two for
        if/else) or ``"switch"``.
    bodies
        Conditional nodes: each body's nodes; a child node: its graph's.

    Examples
    --------
    ```python
    with ng.capture(s) as cap:
        scale[1, 32, s](x, factor)
        factor.update(3.0)
    print([(n.kind, n.label) for n in cap.graph.nodes])
    # [('kernel', 'scale'), ('memset', 'memset')]
    ```
    """

    kind: str
    depends: tuple[int, ...] = ()
    name: str | None = None
    source: str | None = None
    grid: tuple[int, int, int] | None = None
    block: tuple[int, int, int] | None = None
    shared: int | None = None
    args: tuple[NodeArg, ...] = ()
    nbytes: int | None = None
    value: int | None = None
    element_size: int | None = None
    direction: str | None = None
    action: str | None = None
    conditional: str | None = None
    bodies: tuple[tuple["Node", ...], ...] = ()

    @property
    def body(self) -> tuple["Node", ...]:
        """The one body of a while or if node, or a child node's graph.

        Raises
        ------
        ValueError
            The node has no body, or several (read ``bodies``).
        """
        if len(self.bodies) != 1:
            raise ValueError(
                f"this {self.kind} node has {len(self.bodies)} bodies, not one; "
                "read node.bodies")
        return self.bodies[0]

    @property
    def label(self) -> str:
        """What the node does, in a word or two: the kernel's name, ``while``,
        ``memset``, ``alloc``, ..."""
        if self.kind == "kernel":
            return self.name or "(unknown kernel)"
        if self.kind == "conditional":
            return self.conditional or "conditional"
        if self.kind in ("memory", "event") and self.action:
            return self.action if self.kind == "memory" else f"event {self.action}"
        if self.kind == "child":
            return "child graph"
        return self.kind

    @property
    def details(self) -> str:
        """What the node reads or does, in one line: a kernel's arguments, a
        memset's bytes and value, a copy's bytes and direction."""
        if self.kind in ("kernel", "conditional"):
            return ", ".join(str(arg) for arg in self.args)
        if self.kind == "memset":
            return (f"{self.nbytes} B = {self.value:#x} "
                    f"({self.element_size}-byte elements)")
        if self.kind == "memcpy":
            return f"{self.nbytes} B {self.direction}"
        if self.kind == "memory":
            return "" if self.nbytes is None else f"{self.nbytes} B"
        return ""

    def __str__(self) -> str:
        details = self.details
        if self.kind in ("kernel", "conditional"):
            text = f"{self.kind} {self.label}({details})"
        else:
            text = f"{self.kind} {self.label}" if self.label != self.kind else self.kind
            text += f": {details}" if details else ""
        if self.grid is not None:
            text += f" grid {_dims(self.grid)} block {_dims(self.block)}"
        if self.bodies:
            text += f", {len(self.bodies)} {'body' if len(self.bodies) == 1 else 'bodies'}"
        return text


# ---------------------------------------------------------------- launches

class Launches:
    """A capture's kernel launches, described: ``kernels`` (each launched
    kernel once), ``launches`` (``(kernel, args described)`` in launch
    order) and ``conditions`` (each Condition passed, by what a kernel is
    given for it)."""

    __slots__ = ("kernels", "launches", "conditions")

    def __init__(self) -> None:
        self.kernels: list[Any] = []
        self.launches: list[tuple[Any, tuple[NodeArg, ...]]] = []
        self.conditions: dict[Any, NodeArg] = {}


_PYTHON_SCALARS = {bool: "bool", int: "int64", float: "float64", complex: "complex128"}

# dtype -> its name: NumPy works a name out anew at each ask.
_dtype_names: dict[Any, str] = {}


def _dtype_name(dtype: Any, interface: Any = None) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            typestr = (interface or {}).get("typestr")
            return np.dtype(typestr).name if typestr else str(dtype)
        if len(_dtype_names) < 1024:
            _dtype_names[dtype] = name
    return name


def describe_arg(value: Any, conditions: dict[Any, NodeArg] | None = None,
                 made: dict[Any, NodeArg] | None = None) -> NodeArg:
    """``value``, a kernel argument as the user passed it, as a
    :class:`NodeArg`; a Condition is added to ``conditions``. ``made`` holds
    the arrays' and numbers' records made so far, by what they say, for
    another of the same to share."""
    kind = type(value)
    if kind in _registry.device_wrappers:
        name = getattr(value, "name", None)
        if kind.__name__ == "Condition":
            arg = NodeArg("Condition", value=getattr(value, "default", None), name=name)
            state = getattr(value, "_state", None)
            if conditions is not None and state is not None:
                conditions[_backend.condition_argument(state)] = arg
            return arg
        if kind.__name__ == "DeviceScalar":
            return NodeArg("DeviceScalar", dtype=_dtype_name(value.dtype), shape=(1,),
                           name=name)
        return NodeArg("other", type=kind.__name__, name=name)
    scalar = _PYTHON_SCALARS.get(kind)
    if scalar is not None:
        return NodeArg("scalar", dtype=scalar, value=value)
    made = {} if made is None else made
    if isinstance(value, np.generic):
        key: Any = (kind, value.tobytes())
        arg = made.get(key)
        if arg is None:
            arg = made[key] = NodeArg("scalar", dtype=_dtype_name(value.dtype),
                                      value=value.item())
        return arg
    if kind in _backend.DEVICE_ARRAY_TYPES:
        key = (value.shape, value.dtype)
        arg = made.get(key)
        if arg is None:
            arg = made[key] = NodeArg("array", dtype=_dtype_name(value.dtype),
                                      shape=tuple(int(d) for d in value.shape))
        return arg
    if isinstance(value, _backend.DEVICE_ARRAY_TYPES) or hasattr(kind, "__cuda_array_interface__"):
        shape = tuple(int(d) for d in getattr(value, "shape", ()))
        interface = None if isinstance(value, _backend.DEVICE_ARRAY_TYPES) else \
            getattr(value, "__cuda_array_interface__", None)
        return NodeArg("array", dtype=_dtype_name(getattr(value, "dtype", None), interface),
                       shape=shape)
    return NodeArg("other", type=kind.__name__)


def is_launch(entry: Any) -> bool:
    """Whether an entry a graph keeps alive is a launch's ``(kernel, args)``
    (its other entries are scalars, copies' arrays and conditions)."""
    return (type(entry) is tuple and len(entry) == 2 and type(entry[1]) is tuple
            and hasattr(entry[0], "py_func"))


def launches_of(keepalive: Iterable[Any]) -> Launches:
    """The launches among what a graph keeps alive, described. An object
    passed to several launches is described once (what the graph keeps
    holds it, so its id names it throughout)."""
    found = Launches()
    conditions = found.conditions
    described: dict[int, NodeArg] = {}
    made: dict[Any, NodeArg] = {}
    seen: set[int] = set()
    for entry in keepalive:
        if not is_launch(entry):
            continue
        kernel, args = entry
        if id(kernel) not in seen:
            seen.add(id(kernel))
            found.kernels.append(kernel)
        given = []
        for arg in args:
            known = described.get(id(arg))
            if known is None:
                known = described[id(arg)] = describe_arg(arg, conditions, made)
            given.append(known)
        found.launches.append((kernel, tuple(given)))
    return found


def _source(kernel: Any) -> tuple[str | None, str | None]:
    """A kernel's Python name and ``file:line``."""
    func = getattr(kernel, "py_func", None)
    if func is None:
        return None, None
    code = getattr(func, "__code__", None)
    where = None if code is None else f"{code.co_filename}:{code.co_firstlineno}"
    return getattr(func, "__name__", None), where


# ---------------------------------------------------------------- records

def build(executable: Any, launches: Launches) -> tuple[Node, ...]:
    """The records of the graph ``executable`` runs, kernel nodes given the
    arguments of the launches that made them."""
    infos = _backend.describe_graph(executable, launches.kernels)
    waiting: dict[int, deque] = {}
    for kernel, args in launches.launches:
        waiting.setdefault(id(kernel), deque()).append(args)

    def records(graph: Sequence[Any]) -> tuple[Node, ...]:
        made = []
        for info in graph:
            # Bodies are read where their node stands: that is when their
            # launches were made.
            args: tuple[NodeArg, ...] = ()
            name = source = None
            if info.kind == "kernel" and info.kernel is not None:
                queue = waiting.get(id(info.kernel))
                args = queue.popleft() if queue else ()
                name, source = _source(info.kernel)
            elif info.kind == "conditional" and info.condition is not None:
                condition = launches.conditions.get(info.condition)
                args = () if condition is None else (condition,)
            made.append(Node(
                kind=info.kind, depends=tuple(info.depends), name=name, source=source,
                grid=info.grid, block=info.block, shared=info.shared, args=args,
                nbytes=info.nbytes, value=info.value, element_size=info.element_size,
                direction=info.direction, action=info.action, conditional=info.conditional,
                bodies=tuple(records(body) for body in info.bodies)))
        return tuple(made)

    return records(infos)


# ---------------------------------------------------------------- summary

_COLUMNS = ("#", "kind", "name", "grid", "block", "shared", "args", "depends on")


def _dims(dims: tuple[int, int, int] | None) -> str:
    return "-" if dims is None else "(" + ", ".join(str(d) for d in dims) + ")"


def _rows(graph: Sequence[Node], depth: int, rows: list[tuple[str, ...]]) -> None:
    indent = "  " * depth
    for i, node in enumerate(graph):
        label = node.label
        rows.append((
            f"{indent}{i}", node.kind, "-" if label == node.kind else label,
            _dims(node.grid), _dims(node.block),
            "-" if node.shared is None else str(node.shared), node.details or "-",
            ", ".join(str(d) for d in node.depends) or "-",
        ))
        for b, body in enumerate(node.bodies):
            which = f"body {b} of {len(node.bodies)}" if len(node.bodies) > 1 else "body"
            rows.append((f"{indent}  {which} of {i} ({node.label}):",))
            if not body:
                rows.append((f"{indent}  (empty)",))
            _rows(body, depth + 1, rows)


def summary(graph: Sequence[Node]) -> str:
    """A table of ``graph``'s nodes, one row each, bodies indented under
    their node."""
    rows: list[tuple[str, ...]] = []
    _rows(graph, 0, rows)
    table = [row for row in rows if len(row) == len(_COLUMNS)]
    widths = [max(len(row[c]) for row in [_COLUMNS, *table]) for c in range(len(_COLUMNS))]

    def line(row: tuple[str, ...]) -> str:
        if len(row) != len(_COLUMNS):
            return row[0]
        return "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()

    if not graph:
        return line(_COLUMNS) + "\n(no nodes)"
    return "\n".join(line(row) for row in [_COLUMNS, *rows])


# ---------------------------------------------------------------- DOT

def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


_SHAPES = {"kernel": "box", "conditional": "diamond", "memory": "ellipse",
           "memset": "note", "memcpy": "note", "event": "cds", "host": "hexagon",
           "child": "box3d", "empty": "point", "other": "octagon"}


def _dot_nodes(graph: Sequence[Node], prefix: str, lines: list[str], indent: str) -> None:
    ids = [f"{prefix}{i}" for i in range(len(graph))]
    for i, node in enumerate(graph):
        text = [node.label]
        if node.kind == "kernel":
            text.append(f"grid {_dims(node.grid)} block {_dims(node.block)}"
                        + (f" shared {node.shared} B" if node.shared else ""))
        if node.details:
            text.append(node.details)
        attributes = [f"label={_quoted(chr(10).join(text))}",
                      f"shape={_SHAPES.get(node.kind, 'box')}"]
        if node.source:
            attributes.append(f"tooltip={_quoted(node.source)}")
        lines.append(f"{indent}{ids[i]} [{', '.join(attributes)}];")
        for dep in node.depends:
            lines.append(f"{indent}{ids[dep]} -> {ids[i]};")
        for b, body in enumerate(node.bodies):
            cluster = f"{ids[i]}_{b}"
            which = f"body {b}" if len(node.bodies) > 1 else "body"
            lines.append(f"{indent}subgraph cluster_{cluster} {{")
            lines.append(f"{indent}  label={_quoted(f'{which} of {node.label}')};")
            lines.append(f"{indent}  style=dashed;")
            if body:
                _dot_nodes(body, f"{cluster}_", lines, indent + "  ")
                roots = [j for j, inner in enumerate(body) if not inner.depends]
            else:
                lines.append(f'{indent}  {cluster}_empty [label="(empty)", shape=plaintext];')
                roots = []
            lines.append(f"{indent}}}")
            targets = [f"{cluster}_{j}" for j in roots] or [f"{cluster}_empty"]
            for target in targets:
                lines.append(f"{indent}{ids[i]} -> {target} [style=dashed];")


def to_dot(graph: Sequence[Node]) -> str:
    """``graph``'s nodes as Graphviz DOT text: a box per kernel, named as in
    Python, an edge per dependency, each conditional body a cluster."""
    lines = ["digraph captured {", '  node [fontname="Helvetica", fontsize=10];']
    _dot_nodes(graph, "n", lines, "  ")
    lines.append("}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- files

_RENDERED = {".svg": "svg", ".png": "png"}


def check_path(path: Any) -> pathlib.Path:
    """``path`` as a Path whose suffix :func:`save` writes; ValueError
    (TypeError for what is no path) naming the suffixes it takes."""
    try:
        target = pathlib.Path(os.fspath(path))
    except TypeError:
        raise TypeError(
            f"graph.save() takes a file path (str or os.PathLike), not "
            f"{type(path).__name__}") from None
    suffix = target.suffix.lower()
    if suffix != ".dot" and suffix not in _RENDERED:
        raise ValueError(
            f"graph.save({str(path)!r}): the suffix {suffix or '(none)'!r} says no format; "
            "use .dot (DOT text), .svg or .png (drawn by Graphviz's dot)")
    return target


def save(path: Any, dot_text: Callable[[], str]) -> None:
    """Write the DOT text ``dot_text()`` to ``path`` (``.dot``), or draw it
    with Graphviz's ``dot`` into ``path`` (``.svg``, ``.png``)."""
    target = check_path(path)
    fmt = _RENDERED.get(target.suffix.lower())
    if fmt is None:
        target.write_text(dot_text())
        return
    dot = shutil.which("dot")
    text = dot_text()
    if dot is None:
        raise NumbagraphError(
            f"graph.save({str(path)!r}) draws the graph with Graphviz's `dot` program, "
            "which was not found on PATH. Install Graphviz (`apt install graphviz`, "
            "`conda install -c conda-forge graphviz` or `brew install graphviz`), or "
            "save the DOT text with graph.save('graph.dot') and draw it elsewhere")
    done = subprocess.run([dot, f"-T{fmt}", "-o", str(target)], input=text, text=True,
                          capture_output=True, check=False)
    if done.returncode != 0:
        raise NumbagraphError(
            f"Graphviz's dot could not draw the graph into {str(target)!r} "
            f"(exit status {done.returncode}): {done.stderr.strip()}")
