"""Jacobi to convergence inside one graph launch.

Solves the 2-D Poisson problem -lap(u) = f on the unit square, u = 0 on the
boundary, with Jacobi sweeps until the residual norm ||f + lap(u)||_2 falls
below TOL * ||f||_2 (TOL is relative to ||f||). Each iteration runs SWEEPS
sweeps, a kernel that writes the residual, and ``ng.norm2_into`` for its
norm (deterministic: every run gives the same bits).

Three ways, the same kernels and the same answer:

* host-checked, eager: the host launches each iteration's kernels and reads
  the residual back to decide whether to go on;
* host-checked, graph: the iteration is a captured graph the host replays,
  still reading the residual back each time;
* one launch: ``ng.repeat`` loops the iteration on the GPU, counting
  iterations up to MAX_ITERATIONS, and ``ng.stop_when`` ends the loop once
  the residual norm is below the tolerance: the GPU runs to convergence with
  no host round trip. Each iteration of the loop's while node runs several
  iterations of the solver (``unroll="auto"``), those after the converged one
  skipped on the device, so the loop stops after exactly the iteration the
  host-checked loops stop after.

Run: python examples/jacobi_converge.py   (no GPU: runs on Numba's simulator)
"""

import numbagraph as ng  # first, so it can choose the simulator without a GPU

import time

import numpy as np
from numba import cuda

ON_GPU = ng.backend() == "cuda"
N = 32 if ON_GPU else 3          # interior points per side (the simulator is slow)
SWEEPS = 10 if ON_GPU else 4     # Jacobi sweeps per iteration; even, so u holds the result
TOL = 1e-6 if ON_GPU else 3e-3   # relative: stop once ||residual|| < TOL * ||f||
MAX_ITERATIONS = 100_000
TILE = 16 if ON_GPU else N + 2   # sweep blocks are TILE x TILE threads
REPEATS = 3 if ON_GPU else 1     # timed runs per method; the best is reported


@cuda.jit
def sweep(u, f, h2, out):
    """One Jacobi sweep over the interior: out = (neighbours of u + h^2 f) / 4."""
    i, j = cuda.grid(2)
    n = u.shape[0]
    if 0 < i < n - 1 and 0 < j < n - 1:
        out[i, j] = 0.25 * (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] + h2 * f[i, j])


@cuda.jit
def residual(u, f, inv_h2, r):
    """r = f + lap(u) over the interior (the boundary of r stays 0)."""
    i, j = cuda.grid(2)
    n = u.shape[0]
    if 0 < i < n - 1 and 0 < j < n - 1:
        lap = (u[i - 1, j] + u[i + 1, j] + u[i, j - 1] + u[i, j + 1] - 4.0 * u[i, j]) * inv_h2
        r[i, j] = f[i, j] + lap


class Problem:
    """The arrays of one solve, on the device."""

    def __init__(self, s):
        self.s = s
        size = N + 2
        h = 1.0 / (N + 1)
        x = np.linspace(0.0, 1.0, size)
        xx, yy = np.meshgrid(x, x, indexing="ij")
        self.exact = np.sin(np.pi * xx) * np.sin(np.pi * yy)
        f = 2.0 * np.pi**2 * self.exact
        f[0, :] = f[-1, :] = f[:, 0] = f[:, -1] = 0.0
        self.h2, self.inv_h2 = h * h, 1.0 / (h * h)
        self.f_norm = np.linalg.norm(f)
        self.tol = TOL * self.f_norm     # absolute, on ||residual||
        self.zeros = np.zeros((size, size))
        self.f = cuda.to_device(f, stream=s)
        self.u = cuda.to_device(self.zeros, stream=s)
        self.v = cuda.to_device(self.zeros, stream=s)
        self.r = cuda.to_device(self.zeros, stream=s)
        self.norm = ng.DeviceScalar(0.0, dtype=np.float64, stream=s)
        self.iterations = ng.DeviceScalar(0, dtype=np.int32, stream=s)
        self.grid = ((size + TILE - 1) // TILE, (size + TILE - 1) // TILE)

    def reset(self):
        self.u.copy_to_device(self.zeros, stream=self.s)
        self.v.copy_to_device(self.zeros, stream=self.s)
        self.s.synchronize()

    def iterate(self):
        """One iteration's kernels, on the problem's stream."""
        s, u, v, f = self.s, self.u, self.v, self.f
        for _ in range(SWEEPS // 2):
            sweep[self.grid, (TILE, TILE), s](u, f, self.h2, v)
            sweep[self.grid, (TILE, TILE), s](v, f, self.h2, u)
        residual[self.grid, (TILE, TILE), s](u, f, self.inv_h2, self.r)
        ng.norm2_into(self.r, self.norm, stream=s)

    def result(self):
        u = self.u.copy_to_host(stream=self.s)
        self.s.synchronize()
        return u


def host_checked(p, step):
    """Run ``step`` per iteration, reading the residual back after each; stop
    as the one-launch loop does: once the norm is below the tolerance, or
    after MAX_ITERATIONS."""
    iterations = 0
    while iterations < MAX_ITERATIONS:
        step()
        iterations += 1
        if p.norm.value < p.tol:  # waits for the iteration
            break
    return iterations


def capture_one_launch(p):
    """The whole solve as one graph: ``ng.repeat`` counts the iterations on
    the device and ``ng.stop_when`` ends the loop at the tolerance. Returns
    the graph and the loop (its ``unroll``: solver iterations per iteration
    of the while node)."""
    with ng.capture(p.s) as cap:
        p.iterations.update(0)

        @ng.repeat(p.iterations, until=MAX_ITERATIONS, unroll="auto")
        def loop(loop):
            p.iterate()
            ng.stop_when(loop.cond, p.norm, below=p.tol)
    return cap.graph, loop


def timed(p, solve):
    """Best time to solution over REPEATS runs, its iteration count and answer."""
    best = float("inf")
    for _ in range(REPEATS):
        p.reset()
        start = time.perf_counter()
        iterations = solve()
        p.s.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, iterations, p.result()


def main() -> None:
    where = "GPU (CUDA driver)" if ON_GPU else "Numba's CUDA simulator (no GPU found)"
    print(f"numbagraph Jacobi to convergence on {where}")
    print(f"  {N}x{N} interior points, {SWEEPS} sweeps per iteration, "
          f"tolerance {TOL:g} relative to ||f||")
    s = cuda.stream()
    p = Problem(s)
    p.iterate()  # compile outside any capture
    s.synchronize()

    with ng.capture(s) as body:
        p.iterate()
    body_graph = body.graph

    start = time.perf_counter()
    solver, loop = capture_one_launch(p)
    solver.upload()
    s.synchronize()
    capture_time = time.perf_counter() - start

    def one_launch():
        solver.launch()
        return p.iterations.value

    runs = {
        "host-checked, eager launches": timed(p, lambda: host_checked(p, p.iterate)),
        "host-checked, iteration graph": timed(p, lambda: host_checked(p, body_graph.launch)),
        "one graph launch, while loop": timed(p, one_launch),
    }

    (_, iterations, answer), *others = runs.values()
    for _, its, u in others:
        assert its == iterations, f"iteration counts differ: {its} vs {iterations}"
        assert np.array_equal(u, answer), "the solvers disagree"
    assert iterations < MAX_ITERATIONS, "no convergence within MAX_ITERATIONS"
    residual = p.norm.value
    assert residual < p.tol
    error = np.abs(answer - p.exact).max()
    print(f"  converged in {iterations} iterations ({iterations * SWEEPS} sweeps), "
          f"residual norm {residual:.3g} ({residual / p.f_norm:.3g} of ||f||), below the "
          f"tolerance {TOL:g} of ||f|| ({p.tol:.3g})")
    print(f"  max error vs sin(pi x) sin(pi y) {error:.2e}")
    print(f"  the one-launch loop runs {loop.unroll} solver iterations per iteration of its "
          "while node (unroll=\"auto\"), those after convergence skipped on the device")
    for name, (seconds, _, _) in runs.items():
        print(f"  {name:30s}: {seconds * 1e3:9.2f} ms to solution "
              f"({seconds / iterations * 1e6:8.2f} us per iteration)")
    single = runs["one graph launch, while loop"][0]
    eager = runs["host-checked, eager launches"][0]
    replayed = runs["host-checked, iteration graph"][0]
    print(f"  speed-up of one launch: {eager / single:.1f}x over the eager host-checked loop, "
          f"{replayed / single:.1f}x over replaying the iteration graph")
    print(f"  (capturing and uploading the one-launch graph took {capture_time * 1e3:.2f} ms, once)")
    print("  all three give the same answer, bit for bit, after the same number of "
          "iterations")
    if not ON_GPU:
        print("  (simulator timings measure Python, not a GPU)")


if __name__ == "__main__":
    main()
