"""A data-parallel training step as one CUDA graph per GPU.

Every process (one per GPU) holds the same weights ``w`` and its own data,
a target ``t_r``. A step computes the gradient of the squared distance to
the target, averages it over the processes with an all-reduce, and takes a
descent step. The step is captured once (kernels and the all-reduce in one
graph) and replayed ``--steps`` times; each process then checks its
weights against the same steps computed in this one process with NumPy,
for every rank's data.

Run on one machine, one process per GPU:
    torchrun --nproc-per-node=N examples/data_parallel_step.py
    mpirun -np N python examples/data_parallel_step.py
and as one process (world size 1; on Numba's simulator without a GPU):
    python examples/data_parallel_step.py
"""

import numbagraph as ng  # first, so it can choose the simulator without a GPU

import argparse

import numpy as np
from numba import cuda

ON_GPU = ng.backend() == "cuda"
LR = 0.25


@cuda.jit
def gradient(g, w, t, scale):
    """g = scale * (w - t): this rank's share of the mean gradient."""
    i = cuda.grid(1)
    if i < g.size:
        g[i] = scale * (w[i] - t[i])


@cuda.jit
def descend(w, g, lr):
    i = cuda.grid(1)
    if i < w.size:
        w[i] -= lr * g[i]


def target(rank: int, size: int) -> np.ndarray:
    """Rank ``rank``'s data: the same on every process that asks."""
    return np.sin(np.arange(size) * 0.01 + rank)


def initial(size: int) -> np.ndarray:
    return np.cos(np.arange(size) * 0.02)


def reference(world: int, size: int, steps: int) -> np.ndarray:
    """The weights after ``steps`` steps, every rank's data in one process."""
    w = initial(size)
    targets = [target(r, size) for r in range(world)]
    for _ in range(steps):
        g = sum((w - t) / world for t in targets)
        w = w - LR * g
    return w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50 if ON_GPU else 3)
    parser.add_argument("--size", type=int, default=1 << 20 if ON_GPU else 64)
    args = parser.parse_args()

    with ng.dist.init() as comm:
        s = cuda.stream()
        w = cuda.to_device(initial(args.size), stream=s)
        t = cuda.to_device(target(comm.rank, args.size), stream=s)
        g = cuda.device_array(args.size, np.float64, stream=s)
        threads = 256 if ON_GPU else 32
        blocks = (args.size + threads - 1) // threads
        scale = 1.0 / comm.size

        def step() -> None:
            gradient[blocks, threads, s](g, w, t, scale)
            ng.dist.all_reduce_into(g, g, "sum", stream=s)
            descend[blocks, threads, s](w, g, LR)

        ng.precompile(gradient, g, w, t, scale)
        ng.precompile(descend, w, g, LR)
        with ng.capture(s) as cap:
            step()
        graph = cap.graph
        for _ in range(args.steps):
            graph.launch()
        got = w.copy_to_host(stream=s)
        graph.close()

        want = reference(comm.size, args.size, args.steps)
        error = float(np.max(np.abs(got - want)))
        if not np.allclose(got, want, rtol=1e-12, atol=1e-12):
            raise SystemExit(f"rank {comm.rank}/{comm.size}: the replayed steps differ from "
                             f"the single-process computation by up to {error:.3g}")
        print(f"rank {comm.rank}/{comm.size} (device {comm.device}): {args.steps} replays of "
              f"the graphed step match the single-process computation (max error {error:.2g})")


if __name__ == "__main__":
    main()
