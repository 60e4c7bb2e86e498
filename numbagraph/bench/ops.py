"""Suite ``ops``: time per call of numbagraph's ops against PyTorch and CuPy
on the same device buffers: matmul (float32, TF32, float16, bfloat16), matvec (with
its bandwidth as a share of a device copy's), softmax, layernorm, rmsnorm,
max and argmax of 2^28 floats, and ``take_into`` of one row.

Device-bound ops: CUDA events on each peer's stream around R calls enqueued
behind one untimed call (R chosen so that a batch lasts about 20 ms); median
of the trials, the peers taking turns trial by trial. ``take_into`` of one
row is bound by the host: host clock over R eager calls, stopped after the
stream synchronises, as in the ``eager`` suite. Every framework works on the
same numba device arrays (shared through ``__cuda_array_interface__``);
before a peer is timed its output is poisoned (NaN, or -1 for indices), the
op run once and its output checked against a float64 reference computed on
the host, within :data:`TOLERANCES`.

TF32 is off on both sides in the float32 cases (``ng.set_tf32(False)``,
``torch.set_float32_matmul_precision("highest")``) and allowed on both in
the TF32 cases; PyTorch's float16 products accumulate in float32, as
numbagraph's do (``allow_fp16_reduced_precision_reduction = False``), and
so do its bfloat16 products (``allow_bf16_reduced_precision_reduction =
False``). bfloat16 arrays are ml_dtypes' (numba's bfloat16); without
ml_dtypes its cases are left out, with a note.

On Numba's simulator every size is replaced by a small one
(:data:`SIMULATED`): the run proves the code paths, its times are Python's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from numba import cuda

import numbagraph as ng
from numbagraph.ops._operands import BFLOAT16 as _BFLOAT16

from .core import Context, PeerMissing, Row, SuiteResult, clamp_repeats
from .peers import cupy_cuda, numba_tiny, torch_cuda
from .timing import Contender

__all__ = [
    "NAME", "TITLE", "run", "MATMUL_SHAPES", "FLOAT16_MATMUL_SHAPES", "BFLOAT16_MATMUL_SHAPES",
    "MATVEC_SHAPES",
    "SOFTMAX_SHAPES", "NORM_SHAPE", "REDUCE_SIZE", "TAKE_SHAPE", "TOLERANCES",
    "matmul_case", "matvec_case", "matvec_bandwidth_case", "rows_case", "reduce_case",
    "take_case",
]

NAME = "ops"
TITLE = "Ops against PyTorch and CuPy: time per call"
UNIT = "us/call"
PERCENT = "% of copy bandwidth"

# (M, K, N) of out (M, N) = a (M, K) @ b (K, N)
MATMUL_SHAPES = ((4096, 4096, 4096), (1, 4096, 4096), (32, 4096, 11008), (256, 256, 256))
FLOAT16_MATMUL_SHAPES = ((4096, 4096, 4096), (32, 4096, 11008))
BFLOAT16_MATMUL_SHAPES = MATMUL_SHAPES
MATVEC_SHAPES = ((4096, 4096), (11008, 4096), (32000, 4096))   # (M, K)
SOFTMAX_SHAPES = ((32, 32000), (1, 128000))                     # (rows, columns)
NORM_SHAPE = (4096, 4096)
REDUCE_SIZE = 1 << 28
TAKE_SHAPE = (32000, 4096)
FLOAT32, TF32, FLOAT16, BFLOAT16 = "float32", "tf32", "float16", "bfloat16"
COPY = "device copy"

# Each size above and the size it stands for on the simulator.
SIMULATED = {1: 1, 32: 2, 256: 8, 4096: 16, 11008: 24, 32000: 40, 128000: 96,
             REDUCE_SIZE: 384}

# Largest error allowed, as a fraction of the reference's largest magnitude
# (matmul, matvec), or as |got - want| <= atol + rtol * |want| elementwise.
TOLERANCES = {
    FLOAT32: {"scaled": 1e-4},      # float32 sums of K products
    TF32: {"scaled": 5e-3},         # inputs rounded to a 10-bit mantissa
    FLOAT16: {"scaled": 5e-3},      # output rounded to float16
    BFLOAT16: {"scaled": 1e-2},     # output rounded to bfloat16 (8-bit mantissa)
    "softmax": {"rtol": 1e-4, "atol": 1e-9},
    "norm": {"rtol": 1e-4, "atol": 1e-4},
    "exact": {"rtol": 0.0, "atol": 0.0},    # max, argmax, take
}
EPS_LAYERNORM, EPS_RMSNORM = 1e-5, 1e-6
_SAMPLED_ROWS = 64
_BATCH_SECONDS = 0.02      # a timed batch lasts about this long on the GPU
_MAX_REPEATS = 2000


def _dims(ctx: Context, *dims: int) -> tuple:
    return tuple(SIMULATED[d] for d in dims) if ctx.config.simulated else dims


def _x(*dims: int) -> str:
    return "x".join(map(str, dims))


def matmul_case(m: int, k: int, n: int, kind: str) -> str:
    return f"matmul {_x(m, k, n)} {kind}"


def matvec_case(m: int, k: int) -> str:
    return f"matvec {_x(m, k)}"


def matvec_bandwidth_case(m: int, k: int) -> str:
    return f"matvec {_x(m, k)}, {PERCENT}"


def rows_case(op: str, rows: int, cols: int) -> str:
    return f"{op} {_x(rows, cols)}"


def reduce_case(op: str, n: int) -> str:
    size = f"2^{n.bit_length() - 1}" if n >= 1024 and n & (n - 1) == 0 else str(n)
    return f"{op} of {size} float32"


def take_case(rows: int, cols: int) -> str:
    return f"take_into a row of {_x(rows, cols)}"


# ------------------------------------------------------------------ peers

@dataclass
class _Call:
    """One peer's op: ``call()`` enqueues it, ``sync()`` waits for it; CUDA
    events time it on ``stream`` (None: the host clock). ``first()``, if
    given, is the call whose result is checked (an op that returns a new
    array copies it into the checked output there); ``close()`` restores
    settings after the trials."""

    call: Callable[[], Any]
    sync: Callable[[], Any]
    stream: Any
    note: str = ""
    first: Callable[[], Any] | None = None
    close: Callable[[], Any] | None = None


def _numba_stream(ctx: Context) -> Any:
    return numba_tiny(ctx).stream


def _torch(ctx: Context) -> tuple:
    """PyTorch, its side stream, and that stream as a numba stream for events."""
    torch = torch_cuda(ctx)

    def make():
        ts = torch.cuda.Stream()
        return ts, cuda.external_stream(ts.cuda_stream)

    ts, events_on = ctx.shared("ops_torch_stream", make)
    return torch, ts, events_on


def _cupy(ctx: Context) -> tuple:
    cp = cupy_cuda(ctx)

    def make():
        cs = cp.cuda.Stream(non_blocking=True)
        return cs, cuda.external_stream(cs.ptr)

    cs, events_on = ctx.shared("ops_cupy_stream", make)
    return cp, cs, events_on


def _on_torch(ctx: Context, op: Callable[[Any], Callable[[], Any]], note: str,
              first: Callable[[Any], Callable[[], Any]] | None = None,
              close: Callable[[], Any] | None = None) -> _Call:
    """``op(torch)`` run on PyTorch's side stream."""
    torch, ts, events_on = _torch(ctx)
    inner = op(torch)

    def call():
        with torch.cuda.stream(ts):
            inner()

    checked = None
    if first is not None:
        made = first(torch)

        def checked():
            with torch.cuda.stream(ts):
                made()

    return _Call(call, ts.synchronize, events_on, note, checked, close)


def _on_cupy(ctx: Context, op: Callable[[Any], Callable[[], Any]], note: str) -> _Call:
    cp, cs, events_on = _cupy(ctx)
    inner = op(cp)

    def call():
        with cs:
            inner()

    return _Call(call, cs.synchronize, events_on, note)


def _numbagraph(ctx: Context, op: Callable[[Any], Any], note: str,
                close: Callable[[], Any] | None = None) -> _Call:
    s = _numba_stream(ctx)
    return _Call(lambda: op(s), s.synchronize, s, note, close=close)


def _tensor(torch: Any, dev: Any) -> Any:
    if np.dtype(dev.dtype).name == "bfloat16":
        # The array interface has no bfloat16: shared as its bits.
        return torch.as_tensor(dev.view(np.uint16), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(dev, device="cuda")


# ------------------------------------------------------------------ cases

@dataclass
class _Case:
    """One case: its peers' calls (each made on first use), its outputs and
    how they are checked.

    ``outputs(peer)`` are the device arrays ``peer`` writes (poisoned before
    its first call); ``check(peer)`` raises AssertionError naming the first
    wrong element. ``seconds`` estimates one call on the GPU, to choose R.
    ``host_bound`` cases are timed on the host clock over
    ``config.launch_repeats`` calls."""

    label: str
    seconds: float
    peers: dict
    outputs: Callable[[str], list]
    check: Callable[[str], None]
    notes: dict = field(default_factory=dict)
    host_bound: bool = False
    after: Callable[[SuiteResult], None] | None = None


def _estimate(flops: float, nbytes: float) -> float:
    """Seconds of one call on a large GPU: 50 TFLOP/s or 3 TB/s, whichever
    binds (it sets R, not a result)."""
    return max(flops / 50e12, nbytes / 3e12, 5e-6)


def _uniform(rng: np.random.Generator, shape: tuple, dtype: Any,
             lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    x = rng.random(shape, dtype=np.float32)
    x *= hi - lo
    x += lo
    return x.astype(dtype, copy=False)


def _bits(dtype: Any) -> Any:
    """The dtype numba copies ``dtype`` as: bfloat16 as uint16, since numba
    copies through the buffer protocol, which has no bfloat16."""
    return np.dtype(np.uint16) if np.dtype(dtype).name == "bfloat16" else np.dtype(dtype)


def _to_device(ctx: Context, host: np.ndarray) -> Any:
    s = _numba_stream(ctx)
    bits = _bits(host.dtype)
    dev = cuda.to_device(host.view(bits), stream=s).view(host.dtype)
    s.synchronize()
    return dev


def _to_host(dev: Any) -> np.ndarray:
    return dev.view(_bits(dev.dtype)).copy_to_host().view(dev.dtype)


def _empty(ctx: Context, shape: tuple, dtype: Any) -> Any:
    return cuda.device_array(shape, np.dtype(dtype), stream=_numba_stream(ctx))


def _sampled_rows(m: int) -> np.ndarray:
    return np.unique(np.linspace(0, m - 1, min(m, _SAMPLED_ROWS)).astype(np.int64))


def _check_scaled(what: str, got: np.ndarray, want: np.ndarray, tol: float) -> None:
    """Largest error within ``tol`` times the reference's largest magnitude."""
    got = got.astype(np.float64)
    if not np.all(np.isfinite(got)):
        raise AssertionError(f"{what} wrote a non-finite value at flat index "
                             f"{int(np.argmin(np.isfinite(got)))}")
    scale = float(np.max(np.abs(want))) or 1.0
    err = np.abs(got - want)
    worst = np.unravel_index(int(np.argmax(err)), err.shape)
    if err[worst] > tol * scale:
        raise AssertionError(
            f"{what} wrote {got[worst]} at {tuple(map(int, worst))}, expected {want[worst]} "
            f"(error {err[worst] / scale:.2e} of the largest magnitude, allowed {tol:g})")


def _check_close(what: str, got: np.ndarray, want: np.ndarray, rtol: float,
                 atol: float) -> None:
    got = got.astype(np.float64)
    bad = ~(np.abs(got - want) <= atol + rtol * np.abs(want))
    if bad.any():
        where = np.unravel_index(int(np.argmax(bad)), bad.shape)
        raise AssertionError(f"{what} wrote {got[where]} at {tuple(map(int, where))}, "
                             f"expected {want[where]} (rtol {rtol:g}, atol {atol:g})")


def _matmul(ctx: Context, shape: tuple, kind: str) -> _Case:
    m, k, n = _dims(ctx, *shape)
    dtype = {FLOAT16: np.float16, BFLOAT16: _BFLOAT16}.get(kind, np.float32)
    rng = np.random.default_rng(m * 31 + k * 7 + n)
    a_h, b_h = _uniform(rng, (m, k), dtype), _uniform(rng, (k, n), dtype)
    a, b = _to_device(ctx, a_h), _to_device(ctx, b_h)
    out = _empty(ctx, (m, n), dtype)
    rows = _sampled_rows(m)
    want = a_h[rows].astype(np.float64) @ b_h.astype(np.float64)
    tol = TOLERANCES[kind]["scaled"]
    tf32 = kind == TF32

    def numbagraph() -> _Call:
        before = ng.set_tf32(tf32)
        return _numbagraph(ctx, lambda s: ng.matmul_into(a, b, out, stream=s),
                           f"ng.matmul_into ({ng.matmul_backend()})",
                           close=lambda: ng.set_tf32(before))

    def torch_peer() -> _Call:
        torch, _, _ = _torch(ctx)
        flags = torch.backends.cuda.matmul
        precision = torch.get_float32_matmul_precision()
        # Absent from a PyTorch that has no reduced-precision reductions.
        names = ("allow_fp16_reduced_precision_reduction",
                 "allow_bf16_reduced_precision_reduction")
        reduced = {name: getattr(flags, name) for name in names if hasattr(flags, name)}
        torch.set_float32_matmul_precision("high" if tf32 else "highest")
        for name in reduced:
            setattr(flags, name, False)

        def close():
            torch.set_float32_matmul_precision(precision)
            for name, value in reduced.items():
                setattr(flags, name, value)

        def op(torch):
            ta, tb, to = (_tensor(torch, x) for x in (a, b, out))
            return lambda: torch.matmul(ta, tb, out=to)

        return _on_torch(ctx, op, "torch.matmul(a, b, out=out)", close=close)

    def cupy_peer() -> _Call:
        def op(cp):
            if kind == BFLOAT16:
                ca, cb, co = (cp.asarray(x.view(np.uint16)).view(dtype) for x in (a, b, out))
            else:
                ca, cb, co = (cp.asarray(x) for x in (a, b, out))
            return lambda: cp.matmul(ca, cb, out=co)

        return _on_cupy(ctx, op, "cupy.matmul(a, b, out=out)")

    peers = {"numbagraph": numbagraph, "PyTorch": torch_peer}
    notes = {}
    if tf32:
        notes["CuPy"] = "not measured: CuPy allows TF32 only by CUPY_TF32 before import"
    else:
        peers["CuPy"] = cupy_peer
    label = matmul_case(m, k, n, kind)
    return _Case(
        label,
        _estimate(2.0 * m * k * n / (4 if kind != FLOAT32 else 1),
                  (m * k + k * n + m * n) * np.dtype(dtype).itemsize),
        peers, lambda peer: [out],
        lambda peer: _check_scaled(f"{peer}, {label}", _to_host(out)[rows], want, tol),
        notes)


def _matvec(ctx: Context, shape: tuple) -> _Case:
    m, k = _dims(ctx, *shape)
    rng = np.random.default_rng(m + k)
    a_h, x_h = _uniform(rng, (m, k), np.float32), _uniform(rng, (k,), np.float32)
    a, x = _to_device(ctx, a_h), _to_device(ctx, x_h)
    out, copied = _empty(ctx, (m,), np.float32), _empty(ctx, (m, k), np.float32)
    want = a_h.astype(np.float64) @ x_h.astype(np.float64)
    rows = _sampled_rows(m)
    tol = TOLERANCES[FLOAT32]["scaled"]
    label = f"matvec {m}x{k}"

    def check(peer: str) -> None:
        if peer == COPY:
            _check_close(f"{COPY}, {label}", copied.copy_to_host()[rows],
                         a_h[rows].astype(np.float64), 0.0, 0.0)
        else:
            _check_scaled(f"{peer}, {label}", out.copy_to_host(), want, tol)

    def copy_peer() -> _Call:
        # The device copy is a copy kernel, which matches the driver's copy on
        # 1 GiB arrays (bandwidth suite); numba's copy_to_device between
        # device arrays is bound by the host at these sizes.
        src, dst = a.reshape(m * k), copied.reshape(m * k)
        return _numbagraph(ctx, lambda s: ng.copy_into(src, dst, stream=s),
                           "ng.copy_into of the matrix (a copy kernel)")

    def torch_peer() -> _Call:
        def op(torch):
            ta, tx, to = (_tensor(torch, v) for v in (a, x, out))
            return lambda: torch.mv(ta, tx, out=to)

        return _on_torch(ctx, op, "torch.mv(a, x, out=out)")

    def cupy_peer() -> _Call:
        def op(cp):
            ca, cx, co = (cp.asarray(v) for v in (a, x, out))
            return lambda: cp.matmul(ca, cx, out=co)

        return _on_cupy(ctx, op, "cupy.matmul(a, x, out=out)")

    peers = {
        COPY: copy_peer,
        "numbagraph": lambda: _numbagraph(
            ctx, lambda s: ng.matvec_into(a, x, out, stream=s), "ng.matvec_into(a, x, out)"),
        "PyTorch": torch_peer,
        "CuPy": cupy_peer,
    }
    return _Case(matvec_case(m, k), _estimate(2.0 * m * k, 4.0 * m * k), peers,
                 lambda peer: [copied] if peer == COPY else [out], check,
                 after=lambda result: _bandwidth_rows(result, m, k))


def _softmax(ctx: Context, shape: tuple) -> _Case:
    rows, cols = _dims(ctx, *shape)
    rng = np.random.default_rng(rows * 3 + cols)
    x_h = _uniform(rng, (rows, cols), np.float32, -8.0, 8.0)
    x, out = _to_device(ctx, x_h), _empty(ctx, (rows, cols), np.float32)
    e = np.exp(x_h.astype(np.float64) - x_h.max(axis=1, keepdims=True))
    want = e / e.sum(axis=1, keepdims=True)
    tol = TOLERANCES["softmax"]
    label = rows_case("softmax", rows, cols)

    def torch_peer() -> _Call:
        def op(torch):
            tx, to = _tensor(torch, x), _tensor(torch, out)
            return lambda: torch.softmax(tx, -1, out=to)

        return _on_torch(ctx, op, "torch.softmax(x, -1, out=out)")

    peers = {
        "numbagraph": lambda: _numbagraph(
            ctx, lambda s: ng.softmax_into(x, out, stream=s), "ng.softmax_into(x, out)"),
        "PyTorch": torch_peer,
    }
    return _Case(label, _estimate(0.0, 8.0 * rows * cols), peers, lambda peer: [out],
                 lambda peer: _check_close(f"{peer}, {label}", out.copy_to_host(), want,
                                           **tol),
                 {"CuPy": "not measured: CuPy has no softmax with out="})


def _norm(ctx: Context, op: str) -> _Case:
    rows, cols = _dims(ctx, *NORM_SHAPE)
    rng = np.random.default_rng(rows + cols + len(op))
    x_h = _uniform(rng, (rows, cols), np.float32)
    w_h = _uniform(rng, (cols,), np.float32, 0.5, 1.5)
    b_h = _uniform(rng, (cols,), np.float32, -0.5, 0.5)
    x, w, b = (_to_device(ctx, v) for v in (x_h, w_h, b_h))
    out = _empty(ctx, (rows, cols), np.float32)
    x64 = x_h.astype(np.float64)
    if op == "layernorm":
        centred = x64 - x64.mean(axis=1, keepdims=True)
        var = (centred * centred).mean(axis=1, keepdims=True)
        want = centred / np.sqrt(var + EPS_LAYERNORM) * w_h + b_h
    else:
        ms = (x64 * x64).mean(axis=1, keepdims=True)
        want = x64 / np.sqrt(ms + EPS_RMSNORM) * w_h
    label = rows_case(op, rows, cols)

    def numbagraph() -> _Call:
        if op == "layernorm":
            return _numbagraph(
                ctx, lambda s: ng.layernorm_into(x, w, b, out, eps=EPS_LAYERNORM, stream=s),
                "ng.layernorm_into(x, w, b, out)")
        return _numbagraph(
            ctx, lambda s: ng.rmsnorm_into(x, w, out, eps=EPS_RMSNORM, stream=s),
            "ng.rmsnorm_into(x, w, out)")

    def torch_peer() -> _Call:
        torch, _, _ = _torch(ctx)
        functional = torch.nn.functional
        if op == "rmsnorm" and not hasattr(functional, "rms_norm"):
            raise PeerMissing(f"PyTorch {torch.__version__} has no "
                              "torch.nn.functional.rms_norm")

        def make(torch):
            tx, tw, tb, to = (_tensor(torch, v) for v in (x, w, b, out))
            if op == "layernorm":
                return lambda: functional.layer_norm(tx, (cols,), tw, tb, EPS_LAYERNORM)
            return lambda: functional.rms_norm(tx, (cols,), tw, EPS_RMSNORM)

        def first(torch):
            made, to = make(torch), _tensor(torch, out)
            return lambda: to.copy_(made())

        name = "layer_norm(x, (C,), w, b)" if op == "layernorm" else "rms_norm(x, (C,), w)"
        return _on_torch(ctx, make, f"torch.nn.functional.{name}, a new output per call",
                         first=first)

    return _Case(label, _estimate(0.0, 8.0 * rows * cols),
                 {"numbagraph": numbagraph, "PyTorch": torch_peer}, lambda peer: [out],
                 lambda peer: _check_close(f"{peer}, {label}", out.copy_to_host(), want,
                                           **TOLERANCES["norm"]),
                 {"CuPy": f"not measured: CuPy has no {op}"})


class _Reduced:
    """The 2^28 floats of the max and argmax cases: uniform in [-1, 1) with
    one 2.0, the largest, at a known index."""

    def __init__(self, ctx: Context):
        (self.n,) = _dims(ctx, REDUCE_SIZE)
        rng = np.random.default_rng(self.n)
        host = _uniform(rng, (self.n,), np.float32)
        self.where = self.n * 2 // 3 + 7
        host[self.where] = 2.0
        self.x = _to_device(ctx, host)


def _reduce(ctx: Context, data: _Reduced, op: str) -> _Case:
    x, n = data.x, data.n
    arg = op == "argmax"
    out = _empty(ctx, (1,), np.int64 if arg else np.float32)
    want = data.where if arg else 2.0
    label = reduce_case(op, n)

    def check(peer: str) -> None:
        got = out.copy_to_host()[0]
        if got != want:
            raise AssertionError(f"{peer}, {label} wrote {got}, expected {want}")

    def numbagraph() -> _Call:
        fn = ng.argmax_into if arg else ng.max_into
        return _numbagraph(ctx, lambda s: fn(x, out, stream=s), f"ng.{op}_into(x, out)")

    def torch_peer() -> _Call:
        def op_(torch):
            tx, to = _tensor(torch, x), _tensor(torch, out)[0]   # 0-d view
            if arg:
                return lambda: torch.argmax(tx, 0, out=to)
            return lambda: torch.amax(tx, 0, out=to)

        return _on_torch(ctx, op_, f"torch.{'argmax' if arg else 'amax'}(x, 0, out=out)")

    def cupy_peer() -> _Call:
        def op_(cp):
            cx, co = cp.asarray(x), cp.asarray(out)[0]   # 0-d view
            fn = cp.argmax if arg else cp.max
            return lambda: fn(cx, out=co)

        return _on_cupy(ctx, op_, f"cupy.{op}(x, out=out)")

    return _Case(label, _estimate(0.0, 4.0 * n),
                 {"numbagraph": numbagraph, "PyTorch": torch_peer, "CuPy": cupy_peer},
                 lambda peer: [out], check)


def _take(ctx: Context) -> _Case:
    rows, cols = _dims(ctx, *TAKE_SHAPE)
    rng = np.random.default_rng(rows + cols)
    table_h = _uniform(rng, (rows, cols), np.float32)
    table, out = _to_device(ctx, table_h), _empty(ctx, (cols,), np.float32)
    row = rows // 3 + 1
    label = take_case(rows, cols)

    def torch_peer() -> _Call:
        def op(torch):
            tt, to = _tensor(torch, table), _tensor(torch, out)
            return lambda: to.copy_(tt[row])

        return _on_torch(ctx, op, "out.copy_(table[i]), i a Python int")

    def cupy_peer() -> _Call:
        def op(cp):
            ct, co = cp.asarray(table), cp.asarray(out)
            return lambda: cp.copyto(co, ct[row])

        return _on_cupy(ctx, op, "cupy.copyto(out, table[i]), i a Python int")

    peers = {
        "numbagraph": lambda: _numbagraph(
            ctx, lambda s: ng.take_into(table, row, out, stream=s),
            "ng.take_into(table, i, out), i a Python int"),
        "PyTorch": torch_peer,
        "CuPy": cupy_peer,
    }
    return _Case(label, 0.0, peers, lambda peer: [out],
                 lambda peer: _check_close(f"{peer}, {label}", out.copy_to_host(),
                                           table_h[row].astype(np.float64),
                                           **TOLERANCES["exact"]),
                 host_bound=True)


# ------------------------------------------------------------------ timing

def _poison(arrays: list) -> None:
    """Fill ``arrays`` with NaN (-1 for integers) and wait for the device: a
    copy from pageable memory may return before its bytes land, and PyTorch's
    and CuPy's non-blocking streams do not wait for it."""
    for dev in arrays:
        kind = np.dtype(dev.dtype)
        value = -1 if kind.kind in "iub" else np.nan
        bits = _bits(kind)
        target = dev if bits == kind else dev.view(bits)
        target.copy_to_device(np.full(dev.shape, value, dtype=kind).view(bits))
    cuda.synchronize()


def _repeats(ctx: Context, case: _Case) -> int:
    cfg = ctx.config
    if case.host_bound:
        return cfg.launch_repeats
    if cfg.simulated:
        return cfg.bandwidth_repeats
    return clamp_repeats(int(_BATCH_SECONDS / case.seconds), 1, cfg.bandwidth_repeats,
                         _MAX_REPEATS)


def _contender(ctx: Context, case: _Case, peer: str) -> Contender:
    """``peer``'s op, checked once on poisoned outputs, then R calls a batch:
    behind one untimed call, timed by events on its stream; or, host-bound,
    on the host clock."""
    made = case.peers[peer]()
    try:
        _poison(case.outputs(peer))
        (made.first or made.call)()
        made.sync()
        case.check(peer)
    except BaseException:
        if made.close is not None:
            made.close()
        raise
    reps = _repeats(ctx, case)
    call = made.call

    def batch():
        for _ in range(reps):
            call()

    if case.host_bound:
        return Contender(batch, reps, made.sync, close=made.close, note=made.note)
    # One untimed call ahead of the first event keeps the GPU busy while the
    # host enqueues the timed ones: the events time the kernels, not the
    # host's first enqueue.
    return Contender(batch, reps, made.sync, made.stream, close=made.close,
                     note=made.note, lead=call)


def _measure(ctx: Context, result: SuiteResult, case: _Case) -> None:
    ctx.progress(f"{case.label}")
    ctx.compare(result, case.label,
                {peer: (lambda peer=peer: _contender(ctx, case, peer)) for peer in case.peers},
                unit=UNIT)
    for peer, why in case.notes.items():
        result.notes.append(f"{case.label}: {peer} {why}")


def _bandwidth_rows(result: SuiteResult, m: int, k: int) -> None:
    """Each peer's matvec bandwidth, (matrix + vector + output bytes) / time,
    as a percentage of the device copy's, (2 x matrix bytes) / time; trial
    by trial (the peers took turns)."""
    case = matvec_case(m, k)
    copy = result.find(case, COPY)
    if copy is None:
        return
    moved, copied = 4.0 * (m * k + k + m), 8.0 * m * k
    for peer in ("numbagraph", "PyTorch", "CuPy"):
        row = result.find(case, peer)
        if row is None:
            continue
        shares = [100.0 * (moved / t) / (copied / c) for t, c in zip(row.trials, copy.trials)]
        result.rows.append(Row.of(matvec_bandwidth_case(m, k), peer, shares, PERCENT,
                                  row.clock, note="bandwidth / device copy bandwidth"))


def _cases(ctx: Context):
    """The cases in the order they run, each built (and its buffers made)
    when its turn comes, and freed after."""
    for kind in (FLOAT32, TF32):
        for shape in MATMUL_SHAPES:
            yield lambda shape=shape, kind=kind: _matmul(ctx, shape, kind)
    for shape in FLOAT16_MATMUL_SHAPES:
        yield lambda shape=shape: _matmul(ctx, shape, FLOAT16)
    if _BFLOAT16 is not None:
        for shape in BFLOAT16_MATMUL_SHAPES:
            yield lambda shape=shape: _matmul(ctx, shape, BFLOAT16)
    for shape in MATVEC_SHAPES:
        yield lambda shape=shape: _matvec(ctx, shape)
    for shape in SOFTMAX_SHAPES:
        yield lambda shape=shape: _softmax(ctx, shape)
    for op in ("layernorm", "rmsnorm"):
        yield lambda op=op: _norm(ctx, op)
    yield None   # max and argmax share their input
    yield lambda: _take(ctx)


def run(ctx: Context) -> SuiteResult:
    """Time each op by numbagraph and by its peers present, case by case."""
    result = SuiteResult(NAME, TITLE, UNIT)
    for make in _cases(ctx):
        if make is None:
            data = _Reduced(ctx)
            for op in ("max", "argmax"):
                _measure(ctx, result, _reduce(ctx, data, op))
            del data
            continue
        case = make()
        _measure(ctx, result, case)
        if case.after is not None:
            case.after(result)
        del case
    cfg = ctx.config
    result.notes.append(
        "time per call; CUDA events on each peer's stream around R calls (a batch of "
        f"about {_BATCH_SECONDS * 1e3:g} ms, at most {_MAX_REPEATS}) enqueued behind "
        f"one untimed call, median of {cfg.trials} trials, the peers taking turns "
        f"trial by trial; take_into on the host clock over {cfg.launch_repeats} eager "
        "calls, stopped after the stream synchronises")
    result.notes.append(
        "every peer's output checked first against a float64 host reference: matmul "
        "and matvec to a share of the largest magnitude (float32 "
        f"{TOLERANCES[FLOAT32]['scaled']:g}, TF32 {TOLERANCES[TF32]['scaled']:g}, "
        f"float16 {TOLERANCES[FLOAT16]['scaled']:g}, bfloat16 "
        f"{TOLERANCES[BFLOAT16]['scaled']:g}; matmul on {_SAMPLED_ROWS} sampled "
        "rows), softmax to rtol 1e-4, layernorm and rmsnorm to rtol and atol 1e-4; "
        "max, argmax and take exactly")
    result.notes.append(
        "matmul is (M x K) @ (K x N), named MxKxN; TF32 off on both sides in the "
        "float32 cases and allowed on both in the TF32 cases; PyTorch's float16 and "
        "bfloat16 products accumulate in float32 (allow_fp16_reduced_precision_reduction "
        "and allow_bf16_reduced_precision_reduction off), as numbagraph's do")
    if _BFLOAT16 is None:
        result.notes.append("bfloat16 matmul not measured: ml_dtypes, NumPy's bfloat16, "
                            "is not installed (pip install -e \".[bfloat16]\")")
    result.notes.append(
        f"matvec's '{PERCENT}' rows: (matrix + vector + output bytes) / time over the "
        "device copy's (2 x matrix bytes) / time, in the same trials")
    if cfg.simulated:
        result.notes.append("on the simulator every size stands for a small one: "
                            + ", ".join(f"{k} -> {v}" for k, v in SIMULATED.items()))
    return result
