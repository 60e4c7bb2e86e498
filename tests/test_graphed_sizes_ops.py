"""Every op of numbagraph.ops in a function graphed with sizes="update":
which new sizes its graph takes by node updates, and which it captures
instead, with the GraphedWarning naming why. At every size the results
match NumPy's, and what lies past the views the call was given is left
alone. docs/graphed.md ("Which ops take new sizes") tabulates what these
tests show.

Each case calls one op once, on views ``x[:n]`` or ``x[:n, :]`` of buffers
of the largest size; its steps list the sizes called, in order, with what
each call does: run as written (the warm-up), captured, given new sizes by
node updates, or captured after a GraphedWarning. Sizes that cross a path
of an op (one-element inputs, a reduction split over blocks, a row held in
registers or not, a matrix-vector kernel reading several rows per warp)
are worked out from the device's limits, as the ops work them out.
"""

import dataclasses
import math
import warnings
from typing import Any, Callable

import numpy as np
import pytest
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active
from numbagraph.ops import _reduce_kernels, linalg, nn
from numbagraph.ops import reduce as _reduce

SMS, THREADS = active.launch_limits()

EAGER, CAPTURE, RESIZE = "eager", "capture", "resize"


@dataclasses.dataclass(frozen=True)
class Warns:
    """A call captured after a GraphedWarning whose reason matches."""

    reason: str


# The reasons, as the warning words them.
OTHER_KERNEL = Warns("another kernel or overload of it")
MEMORY = Warns("recorded graph memory")


def launched(now: int, held: int) -> Warns:
    """Another count of kernel launches than the graph holds."""
    return Warns(f"made {now} kernel launches, copies and fills in all, where the graph "
                 f"holds {held}\\.")


# 8 run as written, 8 captured, then new sizes up and down.
TAKES = ((8, EAGER), (8, CAPTURE), (24, RESIZE), (5, RESIZE), (40, RESIZE))
# The same for ops of a block per row, whose simulated blocks cost more.
ROWS = ((2, EAGER), (2, CAPTURE), (4, RESIZE), (3, RESIZE))
# One element: one-element arrays are read as scalars, by another kernel,
# captured; the family keeps both graphs, and the next size goes back to
# the first.
ONE_ELEMENT = ((1, OTHER_KERNEL), (3, RESIZE), (6, RESIZE))
# One row: a (1, C) array is C- and F-contiguous, another layout, so
# another family of signatures, with its own warm-up and graph.
ONE_ROW = ((1, EAGER), (1, CAPTURE), (5, RESIZE))

F32 = dict(rtol=1e-5, atol=1e-6)
F32_SUM = dict(rtol=1e-5, atol=1e-5)
F64 = dict(rtol=1e-12, atol=1e-12)
EXACT = dict(rtol=0, atol=0)


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A DeviceScalar among a case's operands."""

    value: Any
    dtype: Any


@dataclasses.dataclass
class Case:
    """One op called once by a graphed function.

    ``buffers``: name -> host array of the largest size (or a Scalar);
    ``out`` is the one written, reset to its host value before each call.
    ``args(d, n)``: the call's arguments, views of the device buffers ``d``.
    ``want(h, n)``: what ``out`` holds after the call, from the host ones.
    """

    op: Callable
    buffers: dict
    args: Callable
    want: Callable
    steps: tuple = TAKES
    tol: dict = dataclasses.field(default_factory=lambda: dict(F32))
    kwargs: dict = dataclasses.field(default_factory=dict)
    numba_matmul: bool = False


def host(shape, dtype=np.float32, lo=-2.0, hi=2.0, seed=0):
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(-9, 10, size=shape).astype(dtype)
    return rng.uniform(lo, hi, size=shape).astype(dtype)


def positive(shape, dtype=np.float32, seed=0):
    return host(shape, dtype, 0.5, 2.0, seed)


def nonzero(shape, dtype=np.float32, seed=1):
    rng = np.random.default_rng(seed + 100)
    return (positive(shape, dtype, seed) * rng.choice([-1, 1], size=shape)).astype(dtype)


def sentinel(shape, dtype=np.float32):
    """An output buffer's content before a call: what no op writes here."""
    return np.full(shape, -7, dtype)


def prefix(out, n, values):
    """``out`` with its first ``n`` rows or elements (or those of a slice
    ``n``) set to ``values``."""
    got = out.copy()
    got[n if isinstance(n, slice) else slice(n)] = values
    return got


N = 64  # elements of 1-d buffers, rows of 2-d ones
C = 6   # columns of 2-d buffers


def erf(x):
    return np.vectorize(math.erf)(x)


# ------------------------------------------------------------ elementwise

BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "maximum": np.maximum, "minimum": np.minimum, "pow": np.power,
}
UNARY = {
    "neg": np.negative, "abs": np.abs, "relu": lambda x: np.maximum(x, 0),
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "tanh": np.tanh, "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "gelu": lambda x: (0.5 * x * (1 + erf(x.astype(np.float64) / math.sqrt(2)))).astype(x.dtype),
}
POSITIVE_ONLY = {"pow", "log", "sqrt", "rsqrt"}


def binary(name):
    ref = BINARY[name]
    x = positive(N) if name in POSITIVE_ONLY else host(N)
    y = host(N, seed=2, lo=0.5) if name == "pow" else nonzero(N)
    return Case(getattr(ng, f"{name}_into"), {"x": x, "y": y, "out": sentinel(N)},
                lambda d, n: (d["x"][:n], d["y"][:n], d["out"][:n]),
                lambda h, n: prefix(h["out"], n, ref(h["x"][:n], h["y"][:n])),
                TAKES + ONE_ELEMENT)


def unary(name):
    ref = UNARY[name]
    x = positive(N) if name in POSITIVE_ONLY else host(N)
    return Case(getattr(ng, f"{name}_into"), {"x": x, "out": sentinel(N)},
                lambda d, n: (d["x"][:n], d["out"][:n]),
                lambda h, n: prefix(h["out"], n, ref(h["x"][:n])),
                TAKES + ONE_ELEMENT)


def elementwise_cases():
    cases = {f"{name}_into": binary(name) for name in BINARY}
    cases.update({f"{name}_into": unary(name) for name in UNARY})
    x, y, cond = host(N), host(N, seed=3), (np.arange(N) % 3 == 0).astype(np.int32)
    cases.update({
        # Arrays of one shape apart: the driver's copy, a memcpy node.
        "copy_into": Case(
            ng.copy_into, {"x": x, "out": sentinel(N)},
            lambda d, n: (d["x"][:n], d["out"][:n]),
            lambda h, n: prefix(h["out"], n, h["x"][:n]),
            TAKES + ((1, RESIZE),), EXACT),
        # A DeviceScalar broadcast: a kernel.
        "copy_into-scalar": Case(
            ng.copy_into, {"v": Scalar(2.5, np.float32), "out": sentinel(N)},
            lambda d, n: (d["v"], d["out"][:n]),
            lambda h, n: prefix(h["out"], n, 2.5),
            TAKES + ((1, RESIZE),), EXACT),
        "fill_into": Case(
            ng.fill_into, {"out": sentinel(N)},
            lambda d, n: (d["out"][:n], 1.5),
            lambda h, n: prefix(h["out"], n, 1.5),
            TAKES + ((1, RESIZE),), EXACT),
        "axpy_into": Case(
            ng.axpy_into, {"a": Scalar(0.5, np.float32), "x": x, "y": y, "out": sentinel(N)},
            lambda d, n: (d["a"], d["x"][:n], d["y"][:n], d["out"][:n]),
            lambda h, n: prefix(h["out"], n, np.float32(0.5) * h["x"][:n] + h["y"][:n]),
            TAKES + ONE_ELEMENT),
        "where_into": Case(
            ng.where_into, {"c": cond, "x": x, "y": y, "out": sentinel(N)},
            lambda d, n: (d["c"][:n], d["x"][:n], d["y"][:n], d["out"][:n]),
            lambda h, n: prefix(h["out"], n, np.where(h["c"][:n] != 0, h["x"][:n], h["y"][:n])),
            TAKES + ONE_ELEMENT, EXACT),
        # A number for cond picks a or b in Python: copy_into, a memcpy node.
        "where_into-number": Case(
            ng.where_into, {"x": x, "y": y, "out": sentinel(N)},
            lambda d, n: (1, d["x"][:n], d["y"][:n], d["out"][:n]),
            lambda h, n: prefix(h["out"], n, h["x"][:n]),
            TAKES, EXACT),
        "astype_into": Case(
            ng.astype_into, {"x": 10 * x, "out": sentinel(N, np.int32)},
            lambda d, n: (d["x"][:n], d["out"][:n]),
            lambda h, n: prefix(h["out"], n, h["x"][:n].astype(np.int32)),
            TAKES + ONE_ELEMENT, EXACT),
        # 2-d: arrays of one shape (flat), and a row broadcast down the rows.
        "add_into-2d": Case(
            ng.add_into, {"x": host((N, C)), "y": host((N, C), seed=4),
                          "out": sentinel((N, C))},
            lambda d, n: (d["x"][:n, :], d["y"][:n, :], d["out"][:n, :]),
            lambda h, n: prefix(h["out"], n, h["x"][:n] + h["y"][:n]),
            TAKES + ONE_ROW),
        "add_into-row": Case(
            ng.add_into, {"x": host((N, C)), "row": host(C, seed=5), "out": sentinel((N, C))},
            lambda d, n: (d["x"][:n, :], d["row"], d["out"][:n, :]),
            lambda h, n: prefix(h["out"], n, h["x"][:n] + h["row"]),
            TAKES + ONE_ROW),
    })
    return cases


# ------------------------------------------------------------ reductions

def wide(x):
    if x is None:
        return None
    return x.astype(np.float64) if x.dtype.kind == "f" else x.astype(np.int64)


REDUCE = {
    "sum": lambda x, y, axis: wide(x).sum(axis=axis),
    "mean": lambda x, y, axis: wide(x).mean(axis=axis),
    "max": lambda x, y, axis: x.max(axis=axis),
    "min": lambda x, y, axis: x.min(axis=axis),
    "argmax": lambda x, y, axis: x.argmax(axis=axis),
    "argmin": lambda x, y, axis: x.argmin(axis=axis),
    "dot": lambda x, y, axis: (wide(x) * wide(y)).sum(axis=axis),
    "norm2": lambda x, y, axis: np.sqrt((wide(x) ** 2).sum(axis=axis)),
}


def reduction(name, length=N, steps=TAKES + ((1, RESIZE),), scalar=False):
    """``name`` of ``x[:n]`` into a one-element array, or a DeviceScalar."""
    ref = REDUCE[name]
    dtype = np.int64 if name.startswith("arg") else np.float32
    buffers = {"x": host(length), "y": host(length, seed=6),
               "out": Scalar(0, dtype) if scalar else sentinel(1, dtype)}
    two = name == "dot"

    def args(d, n):
        return ((d["x"][:n], d["y"][:n]) if two else (d["x"][:n],)) + (d["out"],)

    return Case(getattr(ng, f"{name}_into"), buffers, args,
                lambda h, n: np.asarray(ref(h["x"][:n], h["y"][:n], None), dtype).reshape(
                    () if scalar else 1),
                steps, EXACT if dtype == np.int64 else dict(F32_SUM))


def rows_for(steps):
    """Rows enough for the largest size among ``steps`` (on a GPU, the
    sizes where an op changes its kernels are larger than N)."""
    return max(N, *(n for n, _ in steps))


def row_reduction(name, cols=C, steps=ROWS):
    """``name`` of each row of ``x[:n, :]`` into ``out[:n]``."""
    ref = REDUCE[name]
    dtype = np.int64 if name.startswith("arg") else np.float32
    rows = rows_for(steps)
    buffers = {"x": host((rows, cols)), "y": host((rows, cols), seed=6),
               "out": sentinel(rows, dtype)}
    two = name == "dot"

    def args(d, n):
        return ((d["x"][:n, :], d["y"][:n, :]) if two else (d["x"][:n, :],)) + (d["out"][:n],)

    return Case(getattr(ng, f"{name}_into"), buffers, args,
                lambda h, n: prefix(h["out"], n, ref(h["x"][:n], h["y"][:n], -1)),
                steps, EXACT if dtype == np.int64 else dict(F32_SUM), {"axis": -1})


def reduction_cases():
    cases = {f"{name}_into": reduction(name) for name in REDUCE}
    cases["sum_into-devicescalar"] = reduction("sum", scalar=True)
    cases.update({f"{name}_into-rows": row_reduction(name) for name in REDUCE})
    cases["sum_into-rows"].steps += ONE_ROW
    return cases


# ------------------------------------------------------------ index ops

def index_cases():
    table, row = host((N, C)), host(C, seed=7)
    return {
        # A device index: a kernel.
        "take_into": Case(
            ng.take_into, {"t": table, "i": Scalar(3, np.int32), "out": sentinel(C)},
            lambda d, n: (d["t"][:n, :], d["i"], d["out"]),
            lambda h, n: h["t"][3], TAKES, EXACT),
        "take_into-1d": Case(
            ng.take_into, {"t": host(N), "i": Scalar(3, np.int64), "out": Scalar(0.0, np.float32)},
            lambda d, n: (d["t"][:n], d["i"], d["out"]),
            lambda h, n: h["t"][3], TAKES, EXACT),
        # A Python index: copy_into of the row, a memcpy node.
        "take_into-int": Case(
            ng.take_into, {"t": table, "out": sentinel(C)},
            lambda d, n: (d["t"][:n, :], 3, d["out"]),
            lambda h, n: h["t"][3], TAKES, EXACT),
        "put_into": Case(
            ng.put_into, {"row": row, "i": Scalar(3, np.int32), "out": table},
            lambda d, n: (d["row"], d["i"], d["out"][:n, :]),
            lambda h, n: prefix(h["out"], 4, np.vstack([h["out"][:3], h["row"]])),
            TAKES, EXACT),
        "put_into-int": Case(
            ng.put_into, {"row": row, "out": table},
            lambda d, n: (d["row"], 3, d["out"][:n, :]),
            lambda h, n: prefix(h["out"], 4, np.vstack([h["out"][:3], h["row"]])),
            TAKES, EXACT),
        # A Python index and a number: the row filled by a kernel.
        "put_into-int-number": Case(
            ng.put_into, {"out": table},
            lambda d, n: (2.5, 3, d["out"][:n, :]),
            lambda h, n: prefix(h["out"], 4, np.vstack([h["out"][:3], np.full(C, 2.5)])),
            TAKES, EXACT),
    }


# ------------------------------------------------------------ linear algebra

WARPS = max(1, min(linalg._MATVEC_THREADS, THREADS) // linalg._WARP)


def matvec_rows(together):
    """The fewest rows of which matvec_into reads ``together`` per warp."""
    rows = 1
    while linalg.matvec_rows_per_warp(rows, WARPS, SMS) != together:
        rows += 1
    return rows


def matvec(dtype, cols, steps):
    tol = F64 if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
    rows = rows_for(steps)
    return Case(ng.matvec_into, {"a": host((rows, cols), dtype), "x": host(cols, dtype, seed=8),
                                 "out": sentinel(rows, dtype)},
                lambda d, n: (d["a"][:n, :], d["x"], d["out"][:n]),
                lambda h, n: prefix(h["out"], n, wide(h["a"][:n]) @ wide(h["x"])),
                steps, tol)


def linalg_cases():
    four, two = matvec_rows(4), matvec_rows(2)
    # Rows per warp follow the rows (4 where there are enough, then 2, then
    # 1): each count is another kernel.
    by_rows = ((four + 1, EAGER), (four + 1, CAPTURE), (four + 3, RESIZE), (four, RESIZE),
               (two, OTHER_KERNEL), (two + 1, RESIZE), (2, CAPTURE), (1, EAGER))
    k, m = 5, 4
    return {
        "matvec_into-float64": matvec(np.float64, 8, by_rows),
        "matvec_into-float32-K6": matvec(np.float32, 6, by_rows[:4]),
        # Rows a multiple of 4 long: 16-byte loads, chosen again at each size.
        "matvec_into-float32-K8": matvec(
            np.float32, 8, ((6, EAGER), (6, CAPTURE), (8, RESIZE), (5, RESIZE))),
        "matmul_into": Case(
            ng.matmul_into, {"a": host((N, k)), "b": host((k, m), seed=9),
                             "out": sentinel((N, m))},
            lambda d, n: (d["a"][:n, :], d["b"], d["out"][:n, :]),
            lambda h, n: prefix(h["out"], n, wide(h["a"][:n]) @ wide(h["b"])),
            ROWS + ((16, RESIZE),) + ONE_ROW, dict(F32_SUM), numba_matmul=True),
        # Columns of b and out: strided views, of one layout ("A") at each size.
        "matmul_into-columns": Case(
            ng.matmul_into, {"a": host((m, k)), "b": host((k, 24), seed=9),
                             "out": sentinel((m, 24))},
            lambda d, n: (d["a"], d["b"][:, :n], d["out"][:, :n]),
            lambda h, n: np.hstack([wide(h["a"]) @ wide(h["b"][:, :n]), h["out"][:, n:]]),
            ((8, EAGER), (8, CAPTURE), (16, RESIZE), (3, RESIZE), (20, RESIZE)),
            dict(F32_SUM), numba_matmul=True),
    }


# ------------------------------------------------------------ nn ops

def softmax(x, w, b):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def layernorm(x, w, b):
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5) * w + b


def rmsnorm(x, w, b):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + 1e-6) * w


NN = {"softmax": softmax, "layernorm": layernorm, "rmsnorm": rmsnorm}


def nn_op(name, x_host, args_of, want_of, steps, tol):
    ref = NN[name]
    cols = x_host.shape[-1]
    dtype = x_host.dtype
    buffers = {"x": x_host, "w": host(cols, dtype, seed=10), "b": host(cols, dtype, seed=11),
               "out": sentinel(x_host.shape, dtype)}
    params = {"softmax": (), "layernorm": ("w", "b"), "rmsnorm": ("w",)}[name]

    def args(d, n):
        x, out, extra = args_of(d, n)
        return (x, *(extra(d[p]) for p in params), out)

    def want(h, n):
        return want_of(h, n, lambda x, w, b: ref(wide(x), wide(w), wide(b)))

    return Case(getattr(ng, f"{name}_into"), buffers, args, want, steps, tol)


def nn_rows(name, dtype, cols, steps=ROWS):
    """Rows ``x[:n, :]`` of ``cols`` elements."""
    tol = F64 if dtype == np.float64 else dict(rtol=1e-5, atol=1e-5)
    return nn_op(name, host((16, cols), dtype),
                 lambda d, n: (d["x"][:n, :], d["out"][:n, :], lambda p: p),
                 lambda h, n, f: prefix(h["out"], n, f(h["x"][:n], h["w"], h["b"])),
                 steps, tol)


HELD = nn.HELD_MOST * THREADS       # the longest row held in registers
SPLIT = 2 * nn.PART_PER_THREAD * THREADS    # a lone row this long is split in two


def nn_row_lengths(name):
    """One row ``x[:n]`` (with ``weight[:n]``, ``bias[:n]``) of ``n`` elements."""
    steps = TAKES[:4] + ((HELD + 1, OTHER_KERNEL), (HELD - 28, RESIZE), (HELD + 9, RESIZE),
                         (SPLIT + 4, MEMORY), (HELD - 10, RESIZE), (SPLIT + 8, CAPTURE))
    return nn_op(name, host(SPLIT + 8, np.float64),
                 lambda d, n: (d["x"][:n], d["out"][:n], lambda p: p[:n]),
                 lambda h, n, f: prefix(h["out"], n, f(h["x"][:n], h["w"][:n], h["b"][:n])),
                 steps, F64)


def nn_cases():
    cases = {}
    for name in NN:
        cases[f"{name}_into-float64"] = nn_rows(name, np.float64, C)
        cases[f"{name}_into-float32-C6"] = nn_rows(name, np.float32, C)
        # Rows a multiple of 4 long: 16-byte loads, chosen again at each size.
        cases[f"{name}_into-float32-C8"] = nn_rows(
            name, np.float32, 8, ((2, EAGER), (2, CAPTURE), (4, RESIZE), (3, RESIZE)))
        cases[f"{name}_into-row-lengths"] = nn_row_lengths(name)
    cases["softmax_into-float64"].steps += ONE_ROW
    # The same rows at an offset of 4 bytes from 16-byte groups: read four
    # single elements at a time, which takes new sizes.
    cases["softmax_into-float32-C8-offset"] = nn_op(
        "softmax", host(1 + 16 * 8, np.float32),
        lambda d, n: (d["x"][1:1 + 8 * n].reshape(n, 8), d["out"][1:1 + 8 * n].reshape(n, 8),
                      lambda p: p),
        lambda h, n, f: prefix(h["out"], slice(1, 1 + 8 * n),
                               f(h["x"][1:1 + 8 * n].reshape(n, 8), None, None).reshape(-1)),
        ROWS, dict(rtol=1e-5, atol=1e-6))
    # float32 rows of a length not a multiple of 4, then one that is: the
    # 16-byte kernel is another kernel.
    cases["softmax_into-float32-row-lengths"] = nn_op(
        "softmax", host(64, np.float32),
        lambda d, n: (d["x"][:n], d["out"][:n], lambda p: p),
        lambda h, n, f: prefix(h["out"], n, f(h["x"][:n], None, None)),
        ((9, EAGER), (9, CAPTURE), (23, RESIZE), (5, RESIZE), (41, RESIZE), (8, OTHER_KERNEL),
         (13, RESIZE)),
        dict(rtol=1e-5, atol=1e-6))
    return cases


CASES = {**elementwise_cases(), **reduction_cases(), **index_cases(), **linalg_cases(),
         **nn_cases()}


# ------------------------------------------------------------ the run

def device_buffers(buffers, stream):
    made = {}
    for name, value in buffers.items():
        if isinstance(value, Scalar):
            made[name] = ng.DeviceScalar(value.value, dtype=value.dtype, stream=stream)
        else:
            made[name] = cuda.to_device(value, stream=stream)
    return made


def host_buffers(buffers):
    return {name: np.asarray(v.value, v.dtype) if isinstance(v, Scalar) else v
            for name, v in buffers.items()}


def reset(d, h, stream):
    out = d["out"]
    if isinstance(out, ng.DeviceScalar):
        out.update(h["out"].item())
    else:
        out.copy_to_device(h["out"], stream=stream)


def read(out, stream):
    if isinstance(out, ng.DeviceScalar):
        return np.asarray(out.value)
    return out.copy_to_host(stream=stream)


def what_happened(before, after):
    if after.resizes > before.resizes:
        return RESIZE
    if after.captures > before.captures:
        return CAPTURE
    if after.eager > before.eager:
        return EAGER
    return "replayed"


def run_steps(case, stream, steps=None):
    """Call a graphed function of ``case``'s op at each size of its steps,
    checking what each call did and its results; the function."""
    h = host_buffers(case.buffers)
    d = device_buffers(case.buffers, stream)
    op, kwargs = case.op, case.kwargs

    @ng.graphed(stream=stream, sizes="update")
    def step(*args):
        op(*args, stream=stream, **kwargs)

    for k, (n, expected) in enumerate(steps or case.steps):
        reset(d, h, stream)
        args = case.args(d, n)
        before = step.cache_info()
        if expected is None:  # whatever it does: the results alone are checked
            step(*args)
        elif isinstance(expected, Warns):
            with pytest.warns(ng.GraphedWarning, match=expected.reason):
                step(*args)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error", ng.GraphedWarning)
                step(*args)
        done = what_happened(before, step.cache_info())
        where = f"step {k}, size {n}"
        assert expected is None or done == (CAPTURE if isinstance(expected, Warns) else expected), \
            f"{where}: {done}, expected {expected}"
        want = case.want(h, n)
        got = read(d["out"], stream)
        np.testing.assert_allclose(got.astype(np.float64), np.asarray(want).astype(np.float64),
                                   err_msg=where, **case.tol)
    return step


@pytest.fixture
def fresh_scratch(stream):
    """The stream starts without a reduction scratch of its own."""
    key = (active.stream_handle(stream), active.current_device_id())
    _reduce._scratch.pop(key, None)


@pytest.mark.parametrize("name", list(CASES))
def test_op_in_a_graph_given_new_sizes(stream, fresh_scratch, name):
    case = CASES[name]
    before = ng.set_matmul_backend("numba") if case.numba_matmul else None
    try:
        step = run_steps(case, stream)
    finally:
        if before is not None:
            ng.set_matmul_backend(before)
    assert step.cache_info().resizes == sum(e == RESIZE for _, e in case.steps)


def test_every_op_has_a_case():
    ops = {name for name in ng.ops.__all__ if name.endswith("_into")}
    covered = {getattr(case.op, "__name__", "") for case in CASES.values()}
    assert ops <= covered, sorted(ops - covered)


# ------------------------------------------------------------ reductions split over blocks

# The shortest array a whole-array reduction deals out to two parts: a
# first kernel of a block per part and a second folding them, in the
# stream's scratch.
SPLIT_WHOLE = _reduce_kernels.ADDITIVE_UNROLL * THREADS + 8


# One op of each pair that runs the same kernels with other arguments:
# mean runs sum's, norm2 dot's, min max's and argmin argmax's.
@pytest.mark.parametrize("name", ["sum", "dot", "max", "argmax"])
def test_whole_reduction_split_without_scratch_captures(stream, fresh_scratch, name):
    # The scratch, made inside the capture, is graph memory: every long
    # size is captured; shorter ones go back to the first graph.
    for unroll in (_reduce_kernels.ADDITIVE_UNROLL, _reduce_kernels.EXTREME_UNROLL):
        assert _reduce._plan(SPLIT_WHOLE - 9, unroll) == 1
        assert _reduce._plan(SPLIT_WHOLE, unroll) == 2
    case = reduction(name, length=2 * SPLIT_WHOLE + 8)
    run_steps(case, stream, ((8, EAGER), (8, CAPTURE), (SPLIT_WHOLE, MEMORY),
                             (2 * SPLIT_WHOLE, CAPTURE), (5, RESIZE), (40, RESIZE)))


@pytest.mark.parametrize("name", ["sum", "argmax"])
def test_whole_reduction_split_with_scratch(stream, fresh_scratch, name):
    # The warm-up, run as written at a long size, makes the stream's
    # scratch. One kernel or two is another count of launches, captured
    # once; then each graph takes the sizes of its count, both ways.
    case = reduction(name, length=2 * SPLIT_WHOLE + 8)
    run_steps(case, stream, ((2 * SPLIT_WHOLE, EAGER), (2 * SPLIT_WHOLE, CAPTURE),
                             (SPLIT_WHOLE, RESIZE), (24, launched(1, 2)), (5, RESIZE),
                             (SPLIT_WHOLE + 40, RESIZE), (40, RESIZE)))


# Rows long enough to be cut in two when there are few of them.
SPLIT_COLS = 2 * _reduce_kernels.ADDITIVE_UNROLL * THREADS
MANY_ROWS = _reduce.SPLIT_BELOW_ROWS_PER_SM * SMS


def test_row_reduction_split_without_scratch_captures(stream, fresh_scratch):
    # Few rows (fewer than SPLIT_BELOW_ROWS_PER_SM per multiprocessor), each
    # long enough for two parts: two kernels and the scratch, made inside
    # the capture as graph memory.
    assert _reduce.row_parts(2, SPLIT_COLS, _reduce_kernels.ADDITIVE_UNROLL) == 2
    assert _reduce.row_parts(MANY_ROWS, SPLIT_COLS, _reduce_kernels.ADDITIVE_UNROLL) == 1
    case = row_reduction("sum", cols=SPLIT_COLS, steps=(
        (MANY_ROWS, EAGER), (MANY_ROWS, CAPTURE), (2, MEMORY), (3, CAPTURE),
        (MANY_ROWS + 1, RESIZE)))
    run_steps(case, stream)


def test_row_reduction_split_with_scratch(stream, fresh_scratch):
    # The warm-up, run as written with few rows, makes the scratch.
    assert _reduce.row_parts(3, SPLIT_COLS, _reduce_kernels.EXTREME_UNROLL) == 2
    case = row_reduction("argmax", cols=SPLIT_COLS, steps=(
        (2, EAGER), (2, CAPTURE), (3, RESIZE), (MANY_ROWS, launched(1, 2)),
        (MANY_ROWS + 1, RESIZE), (2, RESIZE)))
    run_steps(case, stream)


# ------------------------------------------------------------ what the warnings say

# A graph whose kernels read float32 16 bytes at a time keeps an alignment
# entry (a Fixed with align=16), which is not library work: the run picks
# its kernels again for the new arrays' alignment.
@pytest.mark.parametrize("name", ["softmax_into-float32-C8", "matvec_into-float32-K8"])
def test_sixteen_byte_loads_are_not_library_work(stream, name):
    case = CASES[name]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run_steps(case, stream, [(n, None) for n, _ in case.steps[:3]])
    said = [str(w.message) for w in seen if issubclass(w.category, ng.GraphedWarning)]
    assert not [m for m in said if "cuBLAS" in m], said
