"""A scripted replay loop: many small kernels per step, one scalar per step.

Each step runs ``KERNELS`` small kernels that all read a step scalar ``t``.
The loop runs once eagerly (one numba launch per kernel) and once as a graph
captured once and replayed per step after ``t.update(step)``; both must give
the same array, and the timings show what a graph saves.

Run: python examples/replay_loop.py   (no GPU: runs on Numba's simulator)
"""

import numbagraph as ng  # first, so it can choose the simulator without a GPU

import time

import numpy as np
from numba import cuda

ON_GPU = ng.backend() == "cuda"
N = 1024 if ON_GPU else 32          # the simulator runs one Python thread per GPU thread
KERNELS = 100 if ON_GPU else 4      # kernels per step
STEPS = 200 if ON_GPU else 5


@cuda.jit
def advance(x, t, k):
    """x[i] = 0.5 * x[i] + t + k * 1e-3 (t read on the device every run)."""
    i = cuda.grid(1)
    if i < x.size:
        x[i] = 0.5 * x[i] + t[0] + k * 1e-3


def reference() -> np.ndarray:
    x = np.zeros(N, np.float32)
    for step in range(STEPS):
        for k in range(KERNELS):
            x = (np.float32(0.5) * x + np.float32(step) + np.float32(k * 1e-3)).astype(np.float32)
    return x


def run_eager(s, x, t) -> float:
    start = time.perf_counter()
    for step in range(STEPS):
        t.update(step)
        for k in range(KERNELS):
            advance[(N + 255) // 256, min(N, 256), s](x, t, k)
    s.synchronize()
    return time.perf_counter() - start


def run_graph(s, x, t) -> tuple[float, ng.CapturedGraph]:
    with ng.capture(s) as cap:
        for k in range(KERNELS):
            advance[(N + 255) // 256, min(N, 256), s](x, t, k)
    graph = cap.graph
    graph.upload()
    start = time.perf_counter()
    for step in range(STEPS):
        t.update(step)
        graph.launch()
    s.synchronize()
    return time.perf_counter() - start, graph


def main() -> None:
    where = "GPU (CUDA driver)" if ON_GPU else "Numba's CUDA simulator (no GPU found)"
    print(f"numbagraph replay loop on {where}")
    print(f"  {STEPS} steps x {KERNELS} kernels on {N} float32")
    s = cuda.stream()
    t = ng.DeviceScalar(0, dtype=np.float32, stream=s)

    x = cuda.to_device(np.zeros(N, np.float32), stream=s)
    advance[(N + 255) // 256, min(N, 256), s](x, t, 0)  # compile outside capture
    x = cuda.to_device(np.zeros(N, np.float32), stream=s)
    eager = run_eager(s, x, t)
    eager_result = x.copy_to_host(stream=s)

    x = cuda.to_device(np.zeros(N, np.float32), stream=s)
    replay, graph = run_graph(s, x, t)
    graph_result = x.copy_to_host(stream=s)
    s.synchronize()

    expected = reference()
    np.testing.assert_allclose(eager_result, expected, rtol=1e-5)
    np.testing.assert_allclose(graph_result, expected, rtol=1e-5)
    launches = STEPS * KERNELS
    print(f"  graph: {graph.num_nodes} nodes, replayed {STEPS} times")
    print(f"  eager : {eager * 1e3:9.2f} ms  ({eager / launches * 1e6:7.2f} us per kernel)")
    print(f"  replay: {replay * 1e3:9.2f} ms  ({replay / launches * 1e6:7.2f} us per kernel)")
    print(f"  speed-up {eager / replay:.1f}x; results match the NumPy reference")
    if not ON_GPU:
        print("  (simulator timings measure Python, not a GPU)")


if __name__ == "__main__":
    main()
