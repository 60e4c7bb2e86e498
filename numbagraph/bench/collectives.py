"""Suite ``dist``: NCCL's all-reduce through ``ng.dist``, recorded in a
step's graph or launched eagerly, and its bus bandwidth against PyTorch's.

* step: a step of the tiny kernel and an all-reduce (sum, out of place) of
  4 KiB, 1 MiB and 64 MiB of float32: the all-reduce recorded in the
  step's graph by ``ng.dist.all_reduce_into`` inside the capture, against
  the graph of the kernel alone with the same all-reduce launched eagerly
  after each replay. CUDA events on the step stream around R steps; time
  per step.
* bus bandwidth: R eager ``ng.dist.all_reduce_into`` back to back, per
  size, against ``torch.distributed.all_reduce`` (NCCL's as PyTorch
  ships it) on the same GPUs. CUDA events around R calls enqueued behind
  one untimed call; NCCL's bus bandwidth, bytes / time x 2 (n - 1) / n for
  n ranks, and on one rank bytes / time (the all-reduce of one rank is a
  copy).

One process per GPU. With two or more GPUs the suite starts the ranks
itself: one ``python -m numbagraph.bench._dist_worker`` per visible GPU,
given ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` as torchrun gives them, each measuring in step with the
others, rank 0 writing its rows to a JSON file this process reads back;
PyTorch's ranks run in processes of their own after numbagraph's. With
one GPU, or on Numba's simulator, numbagraph runs as one rank in this
process (world size 1), so that the code path runs; the targets need
several ranks and are then n/a. Every output is checked before timing:
the all-reduced values must equal the sum over the ranks.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from numba import cuda

import numbagraph as ng
from numbagraph.backend import active as _backend

from .core import Context, PeerMissing, Row, SuiteResult
from .kernels import tiny
from .peers import warm_up
from .timing import Contender

__all__ = ["NAME", "TITLE", "UNIT", "run", "SIZES", "SIMULATED_SIZES", "IN_GRAPH",
           "BETWEEN", "PEER", "TORCH", "SEVERAL", "step_case", "bandwidth_case",
           "size_label", "bus_bandwidth", "measure_numbagraph", "measure_torch",
           "run_ranks"]

NAME = "dist"
TITLE = "Collectives: all-reduce in a step's graph, and bus bandwidth"
UNIT = ""   # time per step and bandwidth side by side

SIZES = (4 << 10, 1 << 20, 64 << 20)
SIMULATED_SIZES = SIZES[:2]

IN_GRAPH = "all-reduce in the graph"
BETWEEN = "all-reduce eager between replays"
PEER = "numbagraph"
TORCH = "PyTorch"
STEP_UNIT = "us/step"
BANDWIDTH_UNIT = "GB/s"

SEVERAL = "needs several GPUs"
# Seconds the ranks of one peer may take, NCCL's start included.
RANKS_TIMEOUT = 180.0

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
# Launchers' variables a spawned rank must not inherit from this process.
_LAUNCHER_VARIABLES = ("TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT",
                       "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK",
                       "MV2_COMM_WORLD_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")


def size_label(nbytes: int) -> str:
    """``nbytes`` as ``4 KiB``, ``1 MiB``, ``64 MiB``."""
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def step_case(nbytes: int) -> str:
    return f"step with an all-reduce of {size_label(nbytes)}"


def bandwidth_case(nbytes: int) -> str:
    return f"all-reduce bus bandwidth, {size_label(nbytes)}"


def bus_bandwidth(nbytes: int, seconds: float, ranks: int) -> float:
    """NCCL's bus bandwidth of an all-reduce in GB/s: ``nbytes / seconds``
    times ``2 (ranks - 1) / ranks``, the share of the data each link
    carries; for one rank, ``nbytes / seconds`` (a copy's)."""
    factor = 2 * (ranks - 1) / ranks if ranks > 1 else 1.0
    return nbytes / seconds * factor / 1e9


def _sizes(ctx: Context) -> tuple:
    return SIMULATED_SIZES if ctx.config.simulated else SIZES


def _repeats(ctx: Context, nbytes: int) -> int:
    """Steps or calls per trial: tens of milliseconds a batch on 8 GPUs."""
    cfg = ctx.config
    if cfg.simulated:
        return 2
    base = 500 if nbytes <= 64 << 10 else (200 if nbytes <= 4 << 20 else 20)
    return base if cfg.quick else 2 * base


# ---------------------------------------------------------------- one rank's data

def _mine(count: int, rank: int) -> np.ndarray:
    """Rank ``rank``'s input: ``i % 7 + rank``, exact in float32."""
    return (np.arange(count) % 7 + rank).astype(np.float32)


def _total(count: int, ranks: int) -> np.ndarray:
    """The sum of every rank's :func:`_mine`."""
    return (ranks * (np.arange(count) % 7) + ranks * (ranks - 1) // 2).astype(np.float32)


def _graph_of(s: Any, record: Callable[[], None]) -> Any:
    with ng.capture(s) as cap:
        record()
    return cap.graph


def _step(ctx: Context, comm: Any, nbytes: int, inside: bool) -> Contender:
    cfg = ctx.config
    count = nbytes // 4
    s = cuda.stream()
    x = cuda.to_device(_mine(count, comm.rank), stream=s)
    out = cuda.device_array(count, np.float32, stream=s)
    a = cuda.to_device(np.zeros(cfg.elements, np.float32), stream=s)
    n = ng.DeviceScalar(1.0, dtype=np.float32, stream=s)
    blocks, threads = cfg.grid
    tiny[blocks, threads, s](a, n)   # compile outside the capture

    def all_reduce() -> None:
        ng.dist.all_reduce_into(x, out, "sum", stream=s, comm=comm)

    def record() -> None:
        tiny[blocks, threads, s](a, n)
        if inside:
            all_reduce()

    graph = _graph_of(s, record)
    launch = graph.launch

    def eager_step() -> None:
        launch()
        all_reduce()

    step = launch if inside else eager_step
    try:
        graph.upload()
        a.copy_to_device(np.zeros(cfg.elements, np.float32), stream=s)
        out.copy_to_device(np.zeros(count, np.float32), stream=s)
        step()
        got, bumped = out.copy_to_host(stream=s), a.copy_to_host(stream=s)
        s.synchronize()
        _check(got, _total(count, comm.size), f"one step ({'in' if inside else 'between'})",
               comm)
        if not np.array_equal(bumped, np.ones(cfg.elements, np.float32)):
            raise AssertionError(f"one step left the kernel's array at {bumped[:4]}..., "
                                 "expected 1 everywhere")
    except BaseException:
        graph.close()
        raise
    reps = _repeats(ctx, nbytes)

    def batch() -> None:
        for _ in range(reps):
            step()

    how = ("the tiny kernel and ng.dist.all_reduce_into recorded in one graph" if inside
           else "a graph of the tiny kernel, then ng.dist.all_reduce_into eagerly")
    return Contender(batch, reps, s.synchronize, stream=s, close=graph.close,
                     note=f"{how}; {comm.size} rank(s); {reps} steps per trial")


def _check(got: np.ndarray, want: np.ndarray, what: str, comm: Any) -> None:
    if not np.array_equal(got, want):
        bad = int(np.argmax(got != want))
        raise AssertionError(
            f"rank {comm.rank} of {comm.size}: after {what} element {bad} of the all-reduce "
            f"is {got[bad]}, expected the sum over the ranks, {want[bad]}")


def _eager(ctx: Context, comm: Any, nbytes: int) -> Contender:
    count = nbytes // 4
    s = cuda.stream()
    x = cuda.to_device(_mine(count, comm.rank), stream=s)
    out = cuda.to_device(np.zeros(count, np.float32), stream=s)

    def all_reduce() -> None:
        ng.dist.all_reduce_into(x, out, "sum", stream=s, comm=comm)

    all_reduce()
    got = out.copy_to_host(stream=s)
    s.synchronize()
    _check(got, _total(count, comm.size), "one eager call", comm)
    reps = _repeats(ctx, nbytes)

    def batch() -> None:
        for _ in range(reps):
            all_reduce()

    return Contender(batch, reps, s.synchronize, stream=s, lead=all_reduce,
                     note=f"ng.dist.all_reduce_into(x, out), out of place; {comm.size} "
                          f"rank(s); {reps} calls per trial behind one untimed call")


def measure_numbagraph(ctx: Context, result: SuiteResult, comm: Any) -> None:
    """This rank's rows of numbagraph: the steps and the bus bandwidth at
    every size. Every rank calls it with the same configuration, so that
    their collectives meet."""
    for nbytes in _sizes(ctx):
        ctx.compare(result, step_case(nbytes),
                    {IN_GRAPH: lambda n=nbytes: _step(ctx, comm, n, True),
                     BETWEEN: lambda n=nbytes: _step(ctx, comm, n, False)},
                    unit=STEP_UNIT, param=nbytes)
    for nbytes in _sizes(ctx):
        ctx.compare(result, bandwidth_case(nbytes),
                    {PEER: lambda n=nbytes: _eager(ctx, comm, n)}, unit=BANDWIDTH_UNIT,
                    param=nbytes,
                    convert=lambda t, n=nbytes: bus_bandwidth(n, t, comm.size))


# ---------------------------------------------------------------- PyTorch's ranks

def _torch_distributed(local: int) -> Any:
    if ng.backend() != "cuda":
        raise PeerMissing(f"PyTorch's NCCL needs the CUDA driver; numbagraph runs on "
                          f"{ng.backend()}")
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        raise PeerMissing(f"PyTorch not installed ({exc})") from exc
    if not torch.cuda.is_available():
        raise PeerMissing(f"PyTorch {torch.__version__} sees no CUDA device")
    if not dist.is_available() or not dist.is_nccl_available():
        raise PeerMissing(f"PyTorch {torch.__version__} has no torch.distributed NCCL backend")
    torch.cuda.set_device(local)
    cuda.select_device(local)   # numba's events on the same device
    return torch


def _torch_all_reduce(ctx: Context, torch: Any, nbytes: int) -> Contender:
    dist = torch.distributed
    rank, size = dist.get_rank(), dist.get_world_size()
    ts = torch.cuda.Stream()
    with torch.cuda.stream(ts):
        t = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32, device="cuda")
        dist.all_reduce(t)
        want = size * (size + 1) // 2
        if not bool((t == want).all()):
            raise AssertionError(f"rank {rank} of {size}: torch.distributed.all_reduce left "
                                 f"{t[:4].tolist()}..., expected {want}, the sum over the "
                                 "ranks")
        t.zero_()   # a sum of zeros stays zero, call after call
    ts.synchronize()
    reps = _repeats(ctx, nbytes)

    def all_reduce() -> None:
        with torch.cuda.stream(ts):
            dist.all_reduce(t)

    def batch() -> None:
        with torch.cuda.stream(ts):
            for _ in range(reps):
                dist.all_reduce(t)

    # all_reduce makes the current stream wait for NCCL's: events on it time the calls.
    return Contender(batch, reps, ts.synchronize, stream=cuda.external_stream(ts.cuda_stream),
                     lead=all_reduce,
                     note=f"torch.distributed.all_reduce(t), in place (its only form); "
                          f"{size} rank(s); {reps} calls per trial behind one untimed call")


def measure_torch(ctx: Context, result: SuiteResult, rank: int, size: int,
                  local: int) -> None:
    """This rank's rows of PyTorch's all-reduce, its process group made
    from the launcher's ``MASTER_ADDR`` and ``MASTER_PORT``."""
    torch = _torch_distributed(local)
    warm_up(ctx)
    dist = torch.distributed
    options: dict[str, Any] = {"device_id": torch.device("cuda", local)}
    try:
        dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=size,
                                **options)
    except TypeError:   # a PyTorch without device_id=
        dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=size)
    try:
        for nbytes in _sizes(ctx):
            ctx.compare(result, bandwidth_case(nbytes),
                        {TORCH: lambda n=nbytes: _torch_all_reduce(ctx, torch, n)},
                        unit=BANDWIDTH_UNIT, param=nbytes,
                        convert=lambda t, n=nbytes: bus_bandwidth(n, t, size))
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- ranks as processes

def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_environment(rank: int, world: int, port: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_VARIABLES}
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env


def run_ranks(ctx: Context, result: SuiteResult, peer: str, world: int,
              timeout: float = RANKS_TIMEOUT) -> None:
    """Start ``world`` processes, rank 0 to ``world - 1``, each measuring
    ``peer`` (``PEER`` or ``TORCH``) on the GPU of its rank, and add rank
    0's rows, skips and failures to ``result``. Rank 0's progress lines
    show as they come. A rank that fails or a run past ``timeout``
    seconds ends every rank, and ``peer`` is recorded as failed."""
    from . import isolation

    port = _free_port()
    ctx.progress(f"{peer}: {world} rank(s), one process each, port {port}")
    with tempfile.TemporaryDirectory(prefix="numbagraph-dist-") as folder:
        rows_file = Path(folder) / "rank0.json"
        command = [sys.executable, "-m", "numbagraph.bench._dist_worker", peer,
                   isolation._config_json(ctx.config), str(rows_file)]
        errors = [open(Path(folder) / f"rank{r}.err", "w+") for r in range(world)]
        ranks: list[subprocess.Popen] = []
        try:
            for rank in range(world):
                ranks.append(subprocess.Popen(
                    command, env=_rank_environment(rank, world, port), text=True,
                    stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
                    stderr=errors[rank]))
            relay = threading.Thread(target=_relay, args=(ctx, ranks[0]), daemon=True)
            relay.start()
            why = _wait(ranks, timeout)
            relay.join(timeout=5)
        except OSError as exc:
            why = f"could not start a rank: {exc}"
        finally:
            for rank in ranks:
                if rank.poll() is None:
                    rank.kill()
                    rank.wait()
        tails = []
        for r, err in enumerate(errors):
            err.seek(0)
            text = err.read().strip()
            err.close()
            if text:
                tails.append(f"rank {r}: ...{text[-600:]}")
        if why is None and not rows_file.exists():
            why = "rank 0 exited without writing its rows"
        if why is not None:
            ctx.fail(result, peer, RuntimeError("; ".join([why, *tails])))
            return
        payload = json.loads(rows_file.read_text())
    for row in payload["rows"]:
        result.rows.append(Row(**row))
    for skipped_peer, reason in payload["skipped"]:
        result.add_skip(skipped_peer, reason)   # rank 0 printed it already
    result.failures += payload["failures"]


def _relay(ctx: Context, rank0: subprocess.Popen) -> None:
    assert rank0.stdout is not None
    for line in rank0.stdout:
        try:
            message = json.loads(line)
        except ValueError:
            message = {"progress": line.rstrip()}
        if "progress" in message:
            ctx.progress(message["progress"])


def _wait(ranks: list, timeout: float) -> str | None:
    """None once every rank exited with status 0; else why not, as soon as
    one rank failed (the others would wait on it in NCCL) or the time ran
    out."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [rank.poll() for rank in ranks]
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            return "; ".join(f"rank {r} exited with status {c}" for r, c in failed)
        if all(c == 0 for c in codes):
            return None
        if time.monotonic() > deadline:
            waiting = [r for r, c in enumerate(codes) if c is None]
            return f"ranks {waiting} still ran after {timeout:g} s"
        time.sleep(0.05)


# ---------------------------------------------------------------- the suite

def _in_process(ctx: Context, result: SuiteResult) -> bool:
    """numbagraph as one rank in this process; False when ng.dist cannot
    run here (the suite is then skipped with ng.dist's reason)."""
    try:
        comm = ng.dist.init(rank=0, world_size=1, device=_backend.current_device_id())
    except ng.DistError as exc:
        ctx.skip(result, PEER, str(exc))
        return False
    try:
        measure_numbagraph(ctx, result, comm)
    finally:
        comm.close()
    return True


def run(ctx: Context) -> SuiteResult:
    """Measure the all-reduce in a step's graph and its bus bandwidth."""
    result = SuiteResult(NAME, TITLE, UNIT)
    several = ng.backend() == "cuda" and _backend.device_count() >= 2
    world = _backend.device_count() if several else 1
    if several:
        run_ranks(ctx, result, PEER, world)
        ran = any(row.peer in (IN_GRAPH, BETWEEN, PEER) for row in result.rows)
    else:
        ran = _in_process(ctx, result)
    if not ran and not any(why.startswith("failed") for _, why in result.skipped):
        reasons = dict(result.skipped)
        ctx.skip(result, TORCH, f"not measured: ng.dist cannot run here "
                                f"({reasons.get(PEER, 'no numbagraph rows')})")
    elif ng.backend() != "cuda":
        ctx.skip(result, TORCH, f"PyTorch's NCCL needs the CUDA driver; numbagraph runs "
                                f"on {ng.backend()}")
    elif importlib.util.find_spec("torch") is None:
        ctx.skip(result, TORCH, "PyTorch not installed")
    else:
        run_ranks(ctx, result, TORCH, world)
    if world < 2:
        result.unjudged = f"{SEVERAL}: this run had one rank (world size 1)"
        result.notes.append(
            "world size 1: the all-reduce of one rank is a copy of x into out (NCCL does "
            "nothing in place), so numbagraph's bandwidth is a copy's, bytes / time, not a "
            "bus bandwidth; PyTorch's works in place, where one rank has nothing to move")
    cfg = ctx.config
    result.notes.append(
        f"{world} rank(s), one process per GPU{' (this process)' if world < 2 else ''}; "
        f"steps: CUDA events on the step stream around R steps; bandwidth: CUDA events "
        f"around R calls behind one untimed call, bus bandwidth = bytes / time x "
        f"2 (n - 1) / n. Median of {cfg.trials} trials after one untimed batch; every "
        "output checked against the sum over the ranks before timing")
    return result


def _payload(result: SuiteResult) -> dict:
    """What rank 0 writes for :func:`run_ranks` to read back."""
    return {"rows": [dataclasses.asdict(r) for r in result.rows],
            "skipped": result.skipped, "failures": result.failures}
