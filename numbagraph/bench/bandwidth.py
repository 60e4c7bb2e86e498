"""Suite ``bandwidth``: effective memory bandwidth of numbagraph's ``_into``
ops on 1 GiB float32 arrays, against PyTorch ``out=``, CuPy ``out=`` and the
device-to-device copy bandwidth of the driver (``cuMemcpyDtoDAsync``).

Effective bandwidth = (bytes each op must read + bytes it must write) /
time: add and axpy move 3 arrays, copy 2, sum 1. CUDA events on the stream
around R back-to-back calls, after one untimed call that keeps the GPU busy
while the host enqueues them; median of the trials. All frameworks work on
the same device buffers (shared through ``__cuda_array_interface__``), filled
with a non-zero pattern; before a framework's op is timed, the output is
poisoned, the op run once and its output checked.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from .core import Context, PeerMissing, SuiteResult
from .kernels import fill_pattern, fill_value
from .peers import cupy_cuda, numba_tiny, torch_cuda
from .timing import Contender

__all__ = ["NAME", "TITLE", "run", "OPS", "COPY_CASE"]

NAME = "bandwidth"
TITLE = "_into ops: effective bandwidth on float32 arrays"
UNIT = "GB/s"
OPS = ("add", "axpy", "copy", "sum")
COPY_CASE = "device copy"
ARRAYS_MOVED = {"add": 3, "axpy": 3, "copy": 2, "sum": 1, COPY_CASE: 2}
ALPHA = 2.0
_CHECKED = 4096   # elements checked at each end of the output


class _Buffers:
    """x, y and out on a numba stream, with their expected values."""

    def __init__(self, ctx: Context):
        self.stream = numba_tiny(ctx).stream
        self.size = ctx.config.bandwidth_elements
        s = self.stream
        self.x = cuda.device_array(self.size, np.float32, stream=s)
        self.y = cuda.device_array(self.size, np.float32, stream=s)
        self.out = cuda.device_array(self.size, np.float32, stream=s)
        self.sum_out = cuda.device_array(1, np.float32, stream=s)
        self._grid = (min(1024, (self.size + 255) // 256), 256)
        blocks, threads = self._grid
        fill_pattern[blocks, threads, s](self.x, 1024, np.float32(1 / 1024))
        fill_pattern[blocks, threads, s](self.y, 509, np.float32(1 / 512))
        s.synchronize()
        ctx.on_close(self.free)

    def free(self) -> None:
        self.x = self.y = self.out = self.sum_out = None

    def poison(self) -> None:
        blocks, threads = self._grid
        fill_value[blocks, threads, self.stream](self.out, np.float32(np.nan))
        fill_value[1, 1, self.stream](self.sum_out, np.float32(np.nan))
        self.stream.synchronize()

    def pattern(self, index: np.ndarray, period: int, scale: float) -> np.ndarray:
        return ((index % period) * np.float32(scale)).astype(np.float32)

    def check(self, op: str) -> None:
        """Raise if ``out`` (or ``sum_out``) does not hold ``op``'s result."""
        self.stream.synchronize()
        if op == "sum":
            got = float(self.sum_out.copy_to_host()[0])
            full, rest = divmod(self.size, 1024)
            want = full * 511.5 + rest * (rest - 1) / 2 / 1024
            if not math.isclose(got, want, rel_tol=1e-3):
                raise AssertionError(f"sum gave {got}, expected {want}")
            return
        k = min(_CHECKED, self.size)
        for start in (0, self.size - k):
            index = np.arange(start, start + k, dtype=np.int64)
            x = self.pattern(index, 1024, 1 / 1024)
            y = self.pattern(index, 509, 1 / 512)
            want = {"add": x + y, "axpy": np.float32(ALPHA) * x + y, "copy": x}[op]
            got = self.out[start:start + k].copy_to_host()
            if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
                bad = int(np.argmax(~np.isclose(got, want, rtol=1e-6, atol=1e-6)))
                raise AssertionError(
                    f"{op} wrote {got[bad]} at element {start + bad}, expected {want[bad]}"
                )


def _buffers(ctx: Context) -> _Buffers:
    return ctx.shared("bandwidth_buffers", lambda: _Buffers(ctx))


def _contender(ctx: Context, buf: _Buffers, op: str, call, sync, events_on) -> Contender:
    """``op`` by one peer, checked once (on a poisoned output) before it is
    timed: R back-to-back calls per trial."""
    buf.poison()
    call()
    sync()
    buf.check("copy" if op == COPY_CASE else op)
    reps = ctx.config.bandwidth_repeats

    def batch():
        for _ in range(reps):
            call()

    # One untimed call ahead of the first event keeps the GPU busy while the
    # host enqueues the timed ones: the events then time the kernels, not
    # the host's first enqueue (which would count against a framework by
    # its Python cost per call, up to a few % of a 1 GiB sum).
    return Contender(batch, reps, sync, events_on, lead=call)


def _inside(stream_context, call):
    """``call`` made with ``stream_context()`` entered: the framework's way of
    putting its work on the peer's stream."""
    def run():
        with stream_context():
            call()
    return run


def _copy_reference(ctx: Context) -> dict:
    buf = _buffers(ctx)
    s = buf.stream
    return {COPY_CASE: (lambda: buf.out.copy_to_device(buf.x, stream=s), s.synchronize, s)}


def _numbagraph(ctx: Context):
    try:
        from numbagraph import ops
    except ImportError as exc:
        raise PeerMissing(f"numbagraph.ops not available ({exc})") from exc
    missing = [f"{op}_into" for op in OPS if not hasattr(ops, f"{op}_into")]
    if len(missing) == len(OPS):
        raise PeerMissing(f"numbagraph.ops not available (it has no {', '.join(missing)})")
    buf = _buffers(ctx)
    s = buf.stream
    x, y, out, sum_out = buf.x, buf.y, buf.out, buf.sum_out
    calls = {
        "add": lambda: ops.add_into(x, y, out, stream=s),
        "axpy": lambda: ops.axpy_into(ALPHA, x, y, out, stream=s),
        "copy": lambda: ops.copy_into(x, out, stream=s),
        "sum": lambda: ops.sum_into(x, sum_out, stream=s),
    }
    for op in missing:
        ctx.progress(f"numbagraph: numbagraph.ops has no {op}")
    return {op: (call, s.synchronize, s) for op, call in calls.items()
            if f"{op}_into" not in missing}


def _torch(ctx: Context):
    torch = torch_cuda(ctx)
    buf = _buffers(ctx)
    buf.stream.synchronize()
    x, y, out = (torch.as_tensor(a, device="cuda") for a in (buf.x, buf.y, buf.out))
    sum_out = torch.as_tensor(buf.sum_out, device="cuda")[0]   # 0-d view
    ts = torch.cuda.Stream()
    events_on = cuda.external_stream(ts.cuda_stream)
    calls = {
        "add": lambda: torch.add(x, y, out=out),
        "axpy": lambda: torch.add(y, x, alpha=ALPHA, out=out),
        "copy": lambda: out.copy_(x),
        "sum": lambda: torch.sum(x, 0, out=sum_out),
    }
    return {op: (_inside(lambda: torch.cuda.stream(ts), call), ts.synchronize, events_on)
            for op, call in calls.items()}


def _cupy(ctx: Context):
    cp = cupy_cuda(ctx)
    buf = _buffers(ctx)
    buf.stream.synchronize()
    x, y, out = (cp.asarray(a) for a in (buf.x, buf.y, buf.out))
    sum_out = cp.asarray(buf.sum_out)[0]   # 0-d view
    axpy = cp.ElementwiseKernel("float32 a, float32 x, float32 y", "float32 o",
                                "o = a * x + y", "numbagraph_bench_axpy")
    alpha = np.float32(ALPHA)
    cs = cp.cuda.Stream(non_blocking=True)
    events_on = cuda.external_stream(cs.ptr)
    calls = {
        "add": lambda: cp.add(x, y, out=out),
        "axpy": lambda: axpy(alpha, x, y, out),
        "copy": lambda: cp.copyto(out, x),
        "sum": lambda: cp.sum(x, out=sum_out),
    }
    return {op: (_inside(lambda: cs, call), cs.synchronize, events_on)
            for op, call in calls.items()}


PEERS = {
    "driver memcpy": _copy_reference,
    "numbagraph": _numbagraph,
    "PyTorch": _torch,
    "CuPy": _cupy,
}
NOTES = {
    ("driver memcpy", COPY_CASE): "cuMemcpyDtoDAsync, read + write counted",
    ("CuPy", "axpy"): "ElementwiseKernel (CuPy has no fused axpy with out=)",
}


def run(ctx: Context) -> SuiteResult:
    """Measure effective bandwidth of the _into ops and their peers: for each
    op, the peers take turns trial by trial on the same buffers."""
    result = SuiteResult(NAME, TITLE, UNIT, higher_is_better=True)
    gib = ctx.config.bandwidth_elements * 4 / 2**30
    ctx.progress(f"allocating 3 arrays of {gib:.3g} GiB")
    calls = {}
    for peer, make in PEERS.items():
        with ctx.recording_errors(result, peer):
            calls[peer] = make(ctx)
    buf = _buffers(ctx) if calls else None
    for op in (COPY_CASE, *OPS):
        nbytes = ARRAYS_MOVED[op] * ctx.config.bandwidth_elements * 4
        setups = {
            peer: lambda op=op, call=mine[op]: _contender(ctx, buf, op, *call)
            for peer, mine in calls.items() if op in mine
        }
        ctx.compare(result, op, setups, unit=UNIT,
                    convert=lambda seconds, nbytes=nbytes: nbytes / seconds / 1e9,
                    notes={peer: NOTES.get((peer, op), f"{nbytes / 2**30:.2f} GiB moved per call")
                           for peer in setups})
    result.notes.append(
        f"arrays of {ctx.config.bandwidth_elements} float32 ({gib:.3g} GiB); "
        "bandwidth = (bytes read + bytes written) / time; CUDA events around "
        f"{ctx.config.bandwidth_repeats} calls enqueued behind one untimed call, "
        f"median of {ctx.config.trials} trials, "
        "the peers taking turns trial by trial; every peer's output checked first"
    )
    return result
