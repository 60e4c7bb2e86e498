"""The 1-D heat equation stepped to its end time in one graph launch.

An explicit finite-difference step, u <- u + r (u[i-1] - 2 u[i] + u[i+1]),
written as one numba kernel. A pass of the loop takes two steps, from u to
v and back, so the state ends in u without a copy. Three ways to run it to
t_end, each checked against NumPy:

  eager       every step launched from the host
  graph/step  a graph of one pass, launched from the host per pass after
              the step counter is updated (the usual replay loop)
  one launch  ng.repeat loops the pass on the GPU, advancing a step counter
              on the device until it reaches the last step; each iteration
              of its while node runs UNROLL passes (a while iteration costs
              the GPU a few microseconds of its own, more than a pass of two
              small kernels), the passes past the last step skipped on the
              device, so the state still ends exactly at step STEPS

Run: python examples/heat_to_t_end.py   (no GPU: runs on Numba's simulator)
"""

import numbagraph as ng  # first, so it can choose the simulator without a GPU

import time

import numpy as np
from numba import cuda

ON_GPU = ng.backend() == "cuda"

# The simulator runs one Python thread per GPU thread: keep it tiny there.
CELLS = 1 << 16 if ON_GPU else 64
STEPS = 2000 if ON_GPU else 10         # even: a pass takes two
R = np.float32(0.25)                   # alpha dt / dx^2, stable below 0.5
THREADS = 256 if ON_GPU else 32
# Passes per iteration of the one-launch loop's while node: 2000 steps are
# 1000 passes, 100 iterations of 10. The simulator's 5 passes make one full
# iteration of 4 and one of a single pass, the other 3 skipped.
UNROLL = "auto" if ON_GPU else 4


@cuda.jit
def diffuse(u, v, r):
    """v = one explicit step of u; the two ends are held fixed."""
    i = cuda.grid(1)
    n = u.size
    if i == 0 or i == n - 1:
        v[i] = u[i]
    elif i < n:
        v[i] = u[i] + r * (u[i - 1] - 2 * u[i] + u[i + 1])


def initial() -> np.ndarray:
    x = np.linspace(0.0, 1.0, CELLS, dtype=np.float32)
    return (np.sin(np.pi * x) + (x > 0.5)).astype(np.float32)


def reference(steps: int) -> np.ndarray:
    u = initial()
    for _ in range(steps):
        v = u.copy()
        v[1:-1] = u[1:-1] + R * (u[:-2] - 2 * u[1:-1] + u[2:])
        u = v
    return u


def main() -> None:
    where = "GPU (CUDA driver)" if ON_GPU else "Numba's CUDA simulator (no GPU found)"
    print(f"numbagraph heat equation to t_end on {where}")
    print(f"  {CELLS} cells, {STEPS} steps, two steps per pass")
    s = cuda.stream()
    u = cuda.to_device(initial(), stream=s)
    v = ng.empty(CELLS, np.float32, stream=s)
    step = ng.DeviceScalar(0, dtype=np.int64, stream=s)
    blocks = (CELLS + THREADS - 1) // THREADS

    def one_pass() -> None:
        diffuse[blocks, THREADS, s](u, v, R)
        diffuse[blocks, THREADS, s](v, u, R)

    def restart() -> None:
        u.copy_to_device(initial(), stream=s)
        step.update(0)
        s.synchronize()

    expected = reference(STEPS)
    scale = float(np.abs(expected).max())

    def check(label: str) -> None:
        got = u.copy_to_host(stream=s)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * scale,
                                   err_msg=f"{label}: u at t_end")

    one_pass()  # compile outside any capture
    restart()
    start = time.perf_counter()
    for _ in range(STEPS // 2):
        one_pass()
    s.synchronize()
    eager = time.perf_counter() - start
    check("eager")

    with ng.capture(s) as cap:
        one_pass()
    per_pass = cap.graph
    per_pass.upload()
    restart()
    start = time.perf_counter()
    for k in range(0, STEPS, 2):
        step.update(k)
        per_pass.launch()
    s.synchronize()
    replay = time.perf_counter() - start
    check("graph per pass")

    with ng.capture(s) as cap:
        @ng.repeat(step, until=STEPS, by=2, unroll=UNROLL)
        def loop(loop):
            one_pass()
    assert loop.unroll > 1, f"{loop.unroll} passes per iteration recorded"
    whole = cap.graph
    whole.upload()
    restart()
    start = time.perf_counter()
    whole.launch()
    s.synchronize()
    once = time.perf_counter() - start
    assert step.value == STEPS, f"the loop stopped at step {step.value}"
    check("one launch")

    per_step = 1e6 / STEPS
    print(f"  eager      : {eager * per_step:9.2f} us per step")
    print(f"  graph/step : {replay * per_step:9.2f} us per step")
    print(f"  one launch : {once * per_step:9.2f} us per step "
          f"({loop.unroll} passes of two steps per iteration of the while node)")
    print(f"  one launch speed-up {replay / once:.1f}x over the graph per pass, "
          f"{eager / once:.1f}x over eager; all three match NumPy at t_end")
    if not ON_GPU:
        print("  (simulator timings measure Python, not a GPU)")


if __name__ == "__main__":
    main()
