"""RK4 on many Lorenz-96 systems: a plain step function, graphed, ping-pong buffers.

Lorenz-96 with N variables per system, dy_j/dt = (y_{j+1} - y_{j-2}) y_{j-1} - y_j + F
(indices wrap around), integrated for M independent systems at once with the
classical fourth-order Runge-Kutta method. One step is a plain Python function,
``step(y, y_next, dt)``, of 13 kernels and ops on one stream:

  dt / 2 and dt / 6 from the DeviceScalar dt        (mul_into, div_into)
  k1 = f(y)                                          (our kernel)
  k2 = f(y + dt/2 k1), k3 = f(y + dt/2 k2), k4 = f(y + dt k3)
                                                     (axpy_into, our kernel)
  y_next = y + dt/6 (k1 + 2 k2 + 2 k3 + k4)           (add_into, axpy_into)

``ng.graphed(step, stream=s)`` runs it as written on its first call and
captures it on the second. The loop alternates the buffers, ``(y, y_next)``
then ``(y_next, y)``: same shapes, so the third call, bringing the first pair
back, is captured into a second graph bound to that pair, and every later
call launches the graph of its pair, nothing rebound. The step runs eagerly
and graphed from the same start; the two must agree bit for bit (the same
kernels on the same data), and both agree with a NumPy reference.

Run: python examples/rk4_pingpong.py   (no GPU: runs on Numba's simulator)
"""

import numbagraph as ng  # first, so it can choose the simulator without a GPU

import time
from typing import Callable

import numpy as np
from numba import cuda

ON_GPU = ng.backend() == "cuda"
SYSTEMS = 4096 if ON_GPU else 2     # independent systems (the simulator runs a
VARIABLES = 40 if ON_GPU else 8     # Python thread per GPU thread: keep it tiny)
STEPS = 400 if ON_GPU else 6        # even, so the result ends up back in y
DT = 0.01
FORCING = 8.0


@cuda.jit
def lorenz96(y, forcing, dydt):
    """dydt = f(y) for every system (row) of y, one thread per variable."""
    i = cuda.grid(1)
    m, n = y.shape
    if i < m * n:
        s, j = i // n, i % n
        dydt[s, j] = ((y[s, (j + 1) % n] - y[s, (j + n - 2) % n]) * y[s, (j + n - 1) % n]
                      - y[s, j] + forcing)


def make_step(shape: tuple[int, int], s) -> Callable:
    """``step(y, y_next, dt)``: one RK4 step from y into y_next, on stream s.

    Its scratch (the stages, dt/2, dt/6) is allocated here, once: a step that
    allocated would be refused when it is captured. The graph keeps using
    these arrays; only the arguments change from call to call.
    """
    k1, k2, k3, k4, stage, acc = (ng.empty(shape, np.float64, stream=s) for _ in range(6))
    half_dt = ng.DeviceScalar(0.0, dtype=np.float64, stream=s)
    sixth_dt = ng.DeviceScalar(0.0, dtype=np.float64, stream=s)
    size = shape[0] * shape[1]
    threads = min(size, 256)
    blocks = (size + threads - 1) // threads

    def f(y, dydt):
        lorenz96[blocks, threads, s](y, FORCING, dydt)

    def step(y, y_next, dt):
        ng.mul_into(dt, 0.5, half_dt, stream=s)
        ng.div_into(dt, 6.0, sixth_dt, stream=s)
        f(y, k1)
        ng.axpy_into(half_dt, k1, y, stage, stream=s)
        f(stage, k2)
        ng.axpy_into(half_dt, k2, y, stage, stream=s)
        f(stage, k3)
        ng.axpy_into(dt, k3, y, stage, stream=s)
        f(stage, k4)
        ng.add_into(k2, k3, acc, stream=s)              # k2 + k3
        ng.axpy_into(2.0, acc, k1, acc, stream=s)       # k1 + 2 k2 + 2 k3
        ng.add_into(acc, k4, acc, stream=s)             # ... + k4
        ng.axpy_into(sixth_dt, acc, y, y_next, stream=s)

    return step


def reference(y0: np.ndarray, steps: int) -> np.ndarray:
    """The same integration in NumPy."""
    def f(y):
        return (np.roll(y, -1, 1) - np.roll(y, 2, 1)) * np.roll(y, 1, 1) - y + FORCING

    y = y0.copy()
    for _ in range(steps):
        k1 = f(y)
        k2 = f(y + DT / 2 * k1)
        k3 = f(y + DT / 2 * k2)
        k4 = f(y + DT * k3)
        y = y + DT / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    return y


def pingpong(step: Callable, y, y_next, dt, steps: int, s) -> float:
    """``steps`` steps alternating the buffers; the seconds they took."""
    start = time.perf_counter()
    for _ in range(steps // 2):
        step(y, y_next, dt)
        step(y_next, y, dt)
    s.synchronize()
    return time.perf_counter() - start


def same_pair(step: Callable, y, y_next, dt, steps: int, s) -> float:
    """``steps`` calls on the same buffers (each computes the same y_next)."""
    start = time.perf_counter()
    for _ in range(steps):
        step(y, y_next, dt)
    s.synchronize()
    return time.perf_counter() - start


def main(systems: int = SYSTEMS, variables: int = VARIABLES, steps: int = STEPS) -> None:
    where = "GPU (CUDA driver)" if ON_GPU else "Numba's CUDA simulator (no GPU found)"
    print(f"numbagraph RK4 ping-pong on {where}")
    print(f"  Lorenz-96, {systems} systems x {variables} variables, {steps} steps "
          f"of dt = {DT}, 13 kernels and ops per step")
    assert steps % 2 == 0 and steps >= 4
    s = cuda.stream()
    shape = (systems, variables)
    rng = np.random.default_rng(0)
    y0 = FORCING + rng.standard_normal(shape)
    start = cuda.to_device(y0, stream=s)
    y = ng.empty(shape, np.float64, stream=s)
    y_next = ng.empty(shape, np.float64, stream=s)
    dt = ng.DeviceScalar(DT, dtype=np.float64, stream=s)

    step = make_step(shape, s)
    graphed_step = ng.graphed(step, stream=s)

    def restart():
        ng.copy_into(start, y, stream=s)
        s.synchronize()

    restart()
    step(y, y_next, dt)         # compile every kernel outside the timings
    restart()
    eager = pingpong(step, y, y_next, dt, steps, s)
    eager_result = y.copy_to_host(stream=s)

    restart()
    t0 = time.perf_counter()
    graphed_step(y, y_next, dt)     # a new signature: runs as written (the warm-up)
    graphed_step(y_next, y, dt)     # the same signature: captured, then launched
    graphed_step(y, y_next, dt)     # the first pair back: a graph of its own, captured
    graphed_step(y_next, y, dt)     # the second pair's graph, launched
    s.synchronize()
    first = time.perf_counter() - t0
    graphed = pingpong(graphed_step, y, y_next, dt, steps - 4, s)
    graphed_result = y.copy_to_host(stream=s)
    s.synchronize()
    info = graphed_step.cache_info()

    assert np.array_equal(graphed_result, eager_result), "graphed and eager steps disagree"
    # Lorenz-96 is chaotic: the GPU contracts a * b + c into one rounding
    # (FMA) where NumPy rounds twice, and the flow amplifies that difference
    # step by step, so the NumPy check is looser than the bit-for-bit one.
    np.testing.assert_allclose(eager_result, reference(y0, steps), rtol=1e-5, atol=1e-5)
    assert (info.captures, info.rebinds) == (2, 0), f"{info}: expected a graph per pair"

    # Against the same calls with the buffers never swapped.
    same = same_pair(graphed_step, y, y_next, dt, steps, s)

    eager, graphed, same = eager / steps, graphed / (steps - 4), same / steps
    print(f"  graphed: {info.captures} captures (a graph per pair), then {info.hits} "
          f"replays, {info.rebinds} of them rebound")
    print(f"  first four graphed calls: {first * 1e3:.2f} ms (one run as written, two "
          "captures and instantiations, four launches)")
    print(f"  eager              : {eager * 1e6:9.2f} us per step")
    print(f"  graphed, ping-pong : {graphed * 1e6:9.2f} us per step (each pair's graph)")
    print(f"  graphed, same pair : {same * 1e6:9.2f} us per step (one graph)")
    print(f"  speed-up {eager / graphed:.1f}x; graphed result matches eager bit for bit, "
          "and the NumPy reference")
    if not ON_GPU:
        print("  (simulator timings measure Python, not a GPU)")


if __name__ == "__main__":
    main()
