"""Watching a graphed solver's residual from Python, replay by replay.

Solves the 1-D Poisson problem -u'' = f on (0, 1), u(0) = u(1) = 0, with
Jacobi sweeps. One step (SWEEPS sweeps, a kernel that writes the residual
f + u'', and ``ng.norm2_into`` for its norm) is captured into a graph, and
two more nodes close it:

* ``norm.read_async(seen)``: the norm stored into ``seen``, a HostScalar
  (pinned host memory mapped into the device's), at every replay;
* ``ng.on_host(record, stream=s)``: a host callback that appends
  ``seen.value`` to a Python list, at every replay, after the copy.

The host replays the graph STEPS times without synchronising once; the
list fills as the GPU goes. The progression it holds is checked against the
same iteration in NumPy.

Run: python examples/watch_residual.py   (no GPU: runs on Numba's simulator)
"""

import numbagraph as ng  # first, so it can choose the simulator without a GPU

import time

import numpy as np
from numba import cuda

ON_GPU = ng.backend() == "cuda"
N = 64 if ON_GPU else 8          # interior points (the simulator is slow)
SWEEPS = 16 if ON_GPU else 2     # Jacobi sweeps per step; even, so u holds the result
STEPS = 60 if ON_GPU else 20     # replays of the step graph
THREADS = 64 if ON_GPU else 16   # threads per block
RTOL = 1e-9                      # agreement with NumPy (summation order, FMA)


@cuda.jit
def sweep(u, f, h2, out):
    """One Jacobi sweep: out[i] = (u[i-1] + u[i+1] + h^2 f[i]) / 2 inside."""
    i = cuda.grid(1)
    if 0 < i < u.size - 1:
        out[i] = 0.5 * (u[i - 1] + u[i + 1] + h2 * f[i])


@cuda.jit
def residual(u, f, inv_h2, r):
    """r = f + u'' inside (the ends of r stay 0)."""
    i = cuda.grid(1)
    if 0 < i < u.size - 1:
        r[i] = f[i] + (u[i - 1] - 2.0 * u[i] + u[i + 1]) * inv_h2


def reference(f, h2, inv_h2):
    """The residual norm after each step, the same iteration in NumPy."""
    u = np.zeros_like(f)
    norms = []
    for _ in range(STEPS):
        for _ in range(SWEEPS):
            v = u.copy()
            v[1:-1] = 0.5 * (u[:-2] + u[2:] + h2 * f[1:-1])
            u = v
        r = np.zeros_like(f)
        r[1:-1] = f[1:-1] + (u[:-2] - 2.0 * u[1:-1] + u[2:]) * inv_h2
        norms.append(float(np.sqrt(np.sum(r * r))))
    return norms


def main() -> None:
    where = "GPU (CUDA driver)" if ON_GPU else "Numba's CUDA simulator (no GPU found)"
    print(f"numbagraph: watching a Jacobi solver's residual on {where}")
    print(f"  {N} interior points, {SWEEPS} sweeps per step, {STEPS} replays")
    size = N + 2
    h = 1.0 / (N + 1)
    h2, inv_h2 = h * h, 1.0 / (h * h)
    x = np.linspace(0.0, 1.0, size)
    f = np.pi**2 * np.sin(np.pi * x)
    f[0] = f[-1] = 0.0
    blocks = (size + THREADS - 1) // THREADS

    s = cuda.stream()
    u = cuda.to_device(np.zeros(size), stream=s)
    v = cuda.to_device(np.zeros(size), stream=s)
    r = cuda.to_device(np.zeros(size), stream=s)
    d_f = cuda.to_device(f, stream=s)
    norm = ng.DeviceScalar(0.0, dtype=np.float64, stream=s)
    seen = ng.HostScalar(np.float64)
    history: list[float] = []

    def record() -> None:
        # Runs on the host at every replay, after the copy into `seen`:
        # reads host memory only (a callback calls no CUDA).
        history.append(seen.value)

    def step() -> None:
        for _ in range(SWEEPS // 2):
            sweep[blocks, THREADS, s](u, d_f, h2, v)
            sweep[blocks, THREADS, s](v, d_f, h2, u)
        residual[blocks, THREADS, s](u, d_f, inv_h2, r)
        ng.norm2_into(r, norm, stream=s)

    step()  # compile outside the capture
    u.copy_to_device(np.zeros(size), stream=s)
    v.copy_to_device(np.zeros(size), stream=s)
    s.synchronize()

    with ng.capture(s) as cap:
        step()
        norm.read_async(seen)          # a kernel node storing into mapped host memory
        ng.on_host(record, stream=s)   # a host node, after the copy
    graph = cap.graph

    start = time.perf_counter()
    for _ in range(STEPS):
        graph.launch()                 # no synchronisation in the loop
    launched = time.perf_counter() - start
    print(f"  {STEPS} replays enqueued in {launched * 1e3:.2f} ms; the callback had "
          f"recorded {len(history)} residuals by then")
    # The list fills as the GPU goes: wait for it without synchronising.
    deadline = time.monotonic() + 60
    while len(history) < STEPS and time.monotonic() < deadline:
        time.sleep(0.0005)
    s.synchronize()                    # raises what a callback raised, if any

    expected = reference(f, h2, inv_h2)
    relative = [value / np.linalg.norm(f) for value in history]
    for k in sorted({0, 1, 2, STEPS // 4, STEPS // 2, STEPS - 1}):
        print(f"  step {k + 1:3d}: residual {history[k]:.6e} ({relative[k]:.2e} of ||f||)")
    assert len(history) == STEPS, f"{len(history)} callbacks ran, {STEPS} expected"
    np.testing.assert_allclose(history, expected, rtol=RTOL)
    assert all(b < a for a, b in zip(history, history[1:])), "the residual must fall"
    print(f"  the callback saw every replay's residual, in order: {STEPS} values that "
          f"match NumPy (rtol {RTOL:g})")
    graph.close()


if __name__ == "__main__":
    main()
